"""Model calls and budgets on both ledgers: a call is recorded, fenced, before it leaves; its
answer is checkpointed in the commit that records it answered and replayed to a later attempt;
a call whose Attempt lost its lease is lost and still counted; a budget reserves before each
call and settles to the real cost; bad input writes nothing. The race of reserve-then-settle
between 8 processes runs on PostgreSQL (SQLite's writers take the whole database in turn)."""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from hashlib import sha256

import pytest
import sqlalchemy as sa

from store import Claim, Intent, InvalidInput, LeaseLost, Ledger, RunIdentity, Usage
from store.budgets import BudgetExhausted, Charge, Window
from store.call_tables import budget_windows_table, model_calls_table
from tests.support.ledger import register_and_claim, snapshot, wait_for_db_clock

PERIOD = datetime(2026, 12, 1, tzinfo=UTC)
DAY = datetime(2026, 12, 1, tzinfo=UTC)
LONG = timedelta(minutes=15)
SHORT = timedelta(seconds=1)
SPAWN = mp.get_context("spawn")


def digest(prompt: str) -> str:
    return sha256(prompt.encode()).hexdigest()


def intent(position: int = 0, prompt: str = "summarize", charge: Charge | None = None) -> Intent:
    return Intent("loopback", "tiny-1", position, digest(prompt), charge)


def claimed(ledger: Ledger, subject: str = "acme", owner: str = "w:1",
            lease: timedelta = LONG) -> Claim:
    found = register_and_claim(ledger, RunIdentity("spend", subject, PERIOD, "v1"), owner=owner,
                                      lease=lease)
    assert found.claim is not None
    return found.claim


def retaken(ledger: Ledger, claim: Claim, owner: str = "w:2") -> Claim:
    """The Run claimed again by ``owner`` once ``claim``'s short lease has expired."""
    wait_for_db_clock(ledger, claim.lease_expires_at)
    again = ledger.claim(claim.run_id, owner, LONG)
    assert again is not None
    return again


def charge(cap: int, estimate: int, job: str = "spend") -> Charge:
    return Charge(job, "money", "EUR", estimate, (Window("period", PERIOD, cap),))


def outcomes(ledger: Ledger, run_id: str) -> list[str | None]:
    return [c.outcome for c in ledger.calls.of_run(run_id)]


def window_row(ledger: Ledger, scope: str = "period") -> dict[str, object]:
    with ledger.engine.connect() as conn:
        row = conn.execute(sa.select(budget_windows_table).where(
            budget_windows_table.c.scope == scope)).one()
    return dict(row._mapping)


def test_a_call_is_recorded_in_flight_before_it_leaves_and_answered_with_its_checkpoint(
    ledger: Ledger,
) -> None:
    """The intent row exists, without outcome, before the request leaves; the answer, its
    tokens, latency and cost are recorded answered in one commit."""
    claim = claimed(ledger)
    call = ledger.calls.record_intent(claim, intent())
    [pending] = ledger.calls.of_run(claim.run_id)
    assert pending.outcome is None and pending.started_at is not None
    assert (pending.attempt_id, pending.fence, pending.position) == (claim.attempt_id, 1, 0)
    ledger.calls.record_answer(call, {"text": "short", "model": "tiny-1"},
                               Usage(120, 30, 250, 27_000, "EUR"))
    [done] = ledger.calls.of_run(claim.run_id)
    assert done.outcome == "answered" and done.finished_at is not None
    assert (done.prompt_tokens, done.completion_tokens, done.latency_ms) == (120, 30, 250)
    assert (done.cost_nanos, done.currency) == (27_000, "EUR")


def test_a_later_attempt_replays_the_checkpoint_of_the_same_position_and_prompt_and_counts_it(
    ledger: Ledger,
) -> None:
    """After a takeover the new Attempt gets the recorded answer for the same position and
    prompt digest (counted as reused), and nothing for another prompt or position."""
    first = claimed(ledger, lease=SHORT)
    call = ledger.calls.record_intent(first, intent())
    ledger.calls.record_answer(call, {"text": "kept"}, Usage(10, 5))
    second = retaken(ledger, first)
    found = ledger.calls.replay(second, 0, digest("summarize"))
    assert found is not None and found.answer == {"text": "kept"}
    assert ledger.calls.replay(second, 0, digest("another prompt")) is None
    assert ledger.calls.replay(second, 1, digest("summarize")) is None
    [recorded] = ledger.calls.of_run(first.run_id)
    assert recorded.reuses == 1


def test_a_stale_attempt_can_neither_record_a_call_nor_replay_one(ledger: Ledger) -> None:
    """A worker whose fence moved on gets LeaseLost before its call leaves and no checkpoint;
    nothing is written."""
    first = claimed(ledger, lease=SHORT)
    call = ledger.calls.record_intent(first, intent())
    ledger.calls.record_answer(call, {"text": "a"}, Usage(1, 1))
    retaken(ledger, first)
    before = snapshot(ledger)
    with pytest.raises(LeaseLost):
        ledger.calls.record_intent(first, intent(1))
    assert ledger.calls.replay(first, 0, digest("summarize")) is None
    assert snapshot(ledger) == before
    assert len(ledger.calls.of_run(first.run_id)) == 1


def test_a_call_in_flight_when_its_attempt_is_taken_over_is_lost_and_still_counted(
    ledger: Ledger,
) -> None:
    """The new holder marks the old Attempt's call lost; the old worker's late answer records
    the usage it was billed but no checkpoint, and it hears LeaseLost: 2 paid, 1 lost."""
    first = claimed(ledger, lease=SHORT)
    lost_call = ledger.calls.record_intent(first, intent())
    second = retaken(ledger, first)
    assert ledger.calls.mark_lost(second.run_id) == [lost_call.call_id]
    assert ledger.calls.mark_lost(second.run_id) == []  # once
    again = ledger.calls.record_intent(second, intent())
    with pytest.raises(LeaseLost):
        ledger.calls.record_answer(lost_call, {"text": "late"}, Usage(40, 9, 900))
    ledger.calls.record_answer(again, {"text": "fresh"}, Usage(40, 8, 300))
    calls = ledger.calls.of_run(first.run_id)
    assert [c.outcome for c in calls] == ["lost", "answered"]
    assert calls[0].completion_tokens == 9 and calls[0].latency_ms == 900
    third = ledger.calls.replay(second, 0, digest("summarize"))
    assert third is not None and third.answer == {"text": "fresh"}


def test_refused_and_failed_calls_are_recorded_with_their_error_and_never_replayed(
    ledger: Ledger,
) -> None:
    """A 429 is refused (not billed), a timeout failed; neither leaves a checkpoint."""
    claim = claimed(ledger)
    refused = ledger.calls.record_intent(claim, intent())
    ledger.calls.record_failure(refused, "refused", "HTTP 429: slow down", Usage(latency_ms=3))
    failed = ledger.calls.record_intent(claim, intent())
    ledger.calls.record_failure(failed, "failed", "ReadTimeout after 60 s")
    assert outcomes(ledger, claim.run_id) == ["refused", "failed"]
    assert ledger.calls.replay(claim, 0, digest("summarize")) is None
    with pytest.raises(InvalidInput, match="refused, failed"):
        ledger.calls.record_failure(failed, "lost", "not a failure outcome")


def test_an_answer_that_validation_rejected_is_kept_and_never_replayed(ledger: Ledger) -> None:
    """Rejected answers stay as evidence; a later attempt calls the model again."""
    claim = claimed(ledger)
    call = ledger.calls.record_intent(claim, intent())
    ledger.calls.record_answer(call, {"text": "nonsense"}, Usage(5, 5))
    assert ledger.calls.reject_answers(claim) == [call.call_id]
    assert ledger.calls.replay(claim, 0, digest("summarize")) is None
    [kept] = ledger.calls.of_run(claim.run_id)
    assert kept.outcome == "answered" and kept.rejected_at is not None


def test_a_budget_reserves_before_each_call_settles_to_the_real_cost_and_refuses_past_the_cap(
    ledger: Ledger,
) -> None:
    """Reserve the estimate, settle to the real cost; a call that would pass the cap is
    refused with nothing recorded, the first refusal of the window says so once."""
    claim = claimed(ledger)
    call = ledger.calls.record_intent(claim, intent(charge=charge(cap=100, estimate=40)))
    assert (window_row(ledger)["reserved"], window_row(ledger)["spent"]) == (40, 0)
    ledger.calls.record_answer(call, {"text": "x"}, Usage(1, 1, 5, 35, "EUR"))
    assert (window_row(ledger)["reserved"], window_row(ledger)["spent"]) == (0, 35)
    second = ledger.calls.record_intent(claim, intent(1, charge=charge(cap=100, estimate=40)))
    ledger.calls.record_failure(second, "refused", "HTTP 429")  # released
    third = ledger.calls.record_intent(claim, intent(1, charge=charge(cap=100, estimate=40)))
    ledger.calls.record_answer(third, {"text": "y"}, Usage(1, 1, 5, 40, "EUR"))
    before = len(ledger.calls.of_run(claim.run_id))
    with pytest.raises(BudgetExhausted) as refused:
        ledger.calls.record_intent(claim, intent(2, charge=charge(cap=100, estimate=40)))
    assert refused.value.first and refused.value.refusal.spent == 75
    with pytest.raises(BudgetExhausted) as again:
        ledger.calls.record_intent(claim, intent(2, charge=charge(cap=100, estimate=40)))
    assert not again.value.first
    assert len(ledger.calls.of_run(claim.run_id)) == before
    row = window_row(ledger)
    assert (row["reserved"], row["spent"], row["refused"]) == (0, 75, 2)
    raised = ledger.calls.record_intent(claim, intent(2, charge=charge(cap=200, estimate=40)))
    assert raised.call_id and window_row(ledger)["exhausted_at"] is None


def test_a_call_refused_by_its_day_window_keeps_no_reservation_in_its_period_window(
    ledger: Ledger,
) -> None:
    """Both windows reserve or neither does."""
    claim = claimed(ledger)
    both = Charge("spend", "tokens", None, 50,
                  (Window("period", PERIOD, 1000), Window("day", DAY, 30)))
    with pytest.raises(BudgetExhausted) as refused:
        ledger.calls.record_intent(claim, intent(charge=both))
    assert refused.value.refusal.window.scope == "day"
    with ledger.engine.connect() as conn:
        rows = conn.execute(sa.select(budget_windows_table.c.scope,
                                      budget_windows_table.c.reserved)).all()
    assert all(reserved == 0 for _, reserved in rows)


def test_a_lost_call_is_charged_its_estimate(ledger: Ledger) -> None:
    """A call that left may have been billed: marked lost, its reservation becomes spent."""
    first = claimed(ledger, lease=SHORT)
    ledger.calls.record_intent(first, intent(charge=charge(cap=100, estimate=40)))
    second = retaken(ledger, first)
    ledger.calls.mark_lost(second.run_id)
    row = window_row(ledger)
    assert (row["reserved"], row["spent"]) == (0, 40)


@pytest.mark.parametrize("bad", [
    lambda: Window("period", PERIOD, -1),
    lambda: Window("period", PERIOD, "10"),  # type: ignore[arg-type]
    lambda: Window("week", PERIOD, 10),
    lambda: Window("period", datetime(2026, 12, 1), 10),
    lambda: Charge("spend", "money", None, 1, (Window("period", PERIOD, 1),)),
    lambda: Charge("spend", "tokens", None, -5, (Window("period", PERIOD, 1),)),
    lambda: Usage(prompt_tokens=-1),
    lambda: Usage(cost_nanos=5),
    lambda: Intent("loopback", "tiny-1", -1, digest("p")),
    lambda: Intent("loopback", "", 0, digest("p")),
    lambda: Intent("loopback", "tiny-1", 0, "not-a-digest"),
])
def test_bad_call_and_budget_input_is_refused_before_anything_is_written(bad: object) -> None:
    """Negative or non-numeric amounts, unknown scopes, naive times, money without a currency,
    a missing model name or digest: InvalidInput."""
    with pytest.raises(InvalidInput):
        bad()  # type: ignore[operator]


# --- the race: 8 processes, one budget --------------------------------------------------------

PROCESSES = 8
RACE_CAP = 20 * 7  # room for exactly 20 calls of cost 7
RACE_ESTIMATE = 7


def _spend(url: str, worker: int, tries: int) -> int:
    """One process: claim Runs of its own and call until the budget refuses; the calls made."""
    made = 0
    with Ledger.connect(url) as ledger:
        for n in range(tries):
            claim = register_and_claim(ledger,
                RunIdentity("spend", f"w{worker}-{n}", PERIOD, "v1"), owner=f"w:{worker}",
                lease=LONG).claim
            assert claim is not None
            try:
                call = ledger.calls.record_intent(
                    claim, intent(charge=charge(RACE_CAP, RACE_ESTIMATE)))
            except BudgetExhausted:
                continue
            ledger.calls.record_answer(call, {"text": "ok"},
                                       Usage(3, 4, 1, RACE_ESTIMATE, "EUR"))
            made += 1
    return made


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_eight_processes_reserving_against_one_budget_never_pass_its_cap(db_url: str) -> None:
    """8 spawned processes race 10 calls each against room for 20: exactly 20 calls are made
    and recorded, and what is spent equals the cap, never more."""
    with ProcessPoolExecutor(PROCESSES, mp_context=SPAWN) as pool:
        made = sum(pool.map(_spend, [db_url] * PROCESSES, range(PROCESSES), [10] * PROCESSES))
    with Ledger.connect(db_url) as ledger, ledger.engine.connect() as conn:
        recorded = conn.execute(sa.select(sa.func.count()).select_from(model_calls_table)).scalar()
        row = conn.execute(sa.select(budget_windows_table)).one()
    assert made == recorded == RACE_CAP // RACE_ESTIMATE
    assert row.spent == RACE_CAP and row.reserved == 0
    assert row.refused == PROCESSES * 10 - made


def test_what_suppressed_duplicates_would_have_cost_is_each_duplicate_runs_answered_calls(
    ledger: Ledger,
) -> None:
    """Two ticks suppress the same completed Run: its answered calls' cost is added once per
    tick (a refused call was not billed, and a rerun would not repeat a lost or failed one:
    they add nothing); a Run without calls adds nothing."""
    first = claimed(ledger, lease=SHORT)
    lost = ledger.calls.record_intent(first, intent())
    claim = retaken(ledger, first)
    assert ledger.calls.mark_lost(claim.run_id) == [lost.call_id]
    with pytest.raises(LeaseLost):  # its late answer is billed, and recorded as such
        ledger.calls.record_answer(lost, {"text": "late"}, Usage(100, 20, 5, 30_000, "EUR"))
    paid = ledger.calls.record_intent(claim, intent())
    ledger.calls.record_answer(paid, {"text": "a"}, Usage(100, 20, 5, 30_000, "EUR"))
    for position, outcome in enumerate(("refused", "failed"), start=1):
        ended = ledger.calls.record_intent(claim, intent(position))
        ledger.calls.record_failure(ended, outcome, f"ended {outcome}",
                                    Usage(7, 0, 1, 1_000, "EUR"))
    assert [c.outcome for c in ledger.calls.of_run(claim.run_id)] == [
        "lost", "answered", "refused", "failed"]
    bare = claimed(ledger, "no-calls")
    day = PERIOD.date()
    for _ in range(2):
        ledger.calls.count_saved("spend", day, [claim.run_id, bare.run_id])
    [row] = ledger.calls.saved_since(day)
    assert (row["currency"], row["runs"], row["calls"]) == ("EUR", 2, 2)
    assert (row["tokens"], row["cost_nanos"]) == (240, 60_000)
    assert ledger.calls.saved_since(day, "other-job") == []


def test_a_run_the_budget_refused_is_pending_again_with_its_attempt_given_back(
    ledger: Ledger,
) -> None:
    """Released over budget: pending, the refusal as its error, attempts back to 0, its
    Attempt released; a stale claim releases nothing."""
    claim = claimed(ledger)
    ledger.calls.release_over_budget(claim, "over budget: raise the cap")
    run = ledger.get(claim.run_id)
    assert (run.status, run.attempts, run.owner) == ("pending", 0, None)
    assert run.error == "over budget: raise the cap"
    assert [a.outcome for a in ledger.attempts(claim.run_id)] == ["released"]
    before = snapshot(ledger)
    with pytest.raises(LeaseLost):
        ledger.calls.release_over_budget(claim, "again")
    assert snapshot(ledger) == before
