"""Provider batches on both ledgers: a call is queued under its Run's lease and once per
(position, prompt); its Run waits without being claimed; a batch takes its job and endpoint's
unbatched queued calls under a fenced lease (database clock); its results settle each call
once, with the budget, only under the lease; finishing it requeues what was not answered and
releases (or fails) the Runs that waited, whose next attempt replays the settled answers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from bench.batch_provider import BatchServer
from flows.batches.submit import submit
from flows.model.batch.openai import OpenAIBatchClient
from store import (
    WITHDRAWN,
    AlreadyAnswered,
    AlreadyQueued,
    BatchClaim,
    BatchCounts,
    Charge,
    Claim,
    End,
    Intent,
    LeaseLost,
    Ledger,
    Queued,
    RunIdentity,
    Usage,
    Window,
    document_digest,
)
from store.call_tables import budget_windows_table
from tests.support.ledger import register_and_claim, snapshot, wait_for_db_clock

PERIOD = datetime(2026, 12, 1, tzinfo=UTC)
LONG = timedelta(minutes=15)
SHORT = timedelta(seconds=1)
JOB = "digest"


def digest(prompt: str) -> str:
    return sha256(prompt.encode()).hexdigest()


def identity(subject: str, job: str = JOB) -> RunIdentity:
    return RunIdentity(job, subject, PERIOD, "v1")


def claimed(ledger: Ledger, subject: str, *, job: str = JOB, owner: str = "w:1",
            lease: timedelta = LONG) -> Claim:
    found = register_and_claim(ledger, identity(subject, job), owner=owner, lease=lease)
    assert found.claim is not None
    return found.claim


def charge(estimate: int, cap: int = 1_000_000, job: str = JOB) -> Charge:
    return Charge(job, "money", "EUR", estimate, (Window("period", PERIOD, cap),))


def queued(subject: str, position: int = 0, endpoint: str = "openai-main",
           estimate: int | None = None, tokens: int | None = None) -> Intent:
    prompt = f"summarize {subject} {position}"
    return Intent(endpoint, "tiny-1", position, digest(prompt),
                  None if estimate is None else charge(estimate),
                  queued=Queued(f"{subject}-{position}", {"messages": [prompt]}, tokens=tokens))


def queue(ledger: Ledger, subject: str, *, positions: tuple[int, ...] = (0,),
          endpoint: str = "openai-main", estimate: int | None = None,
          job: str = JOB, tokens: int | None = None) -> Claim:
    """A Run of ``subject`` claimed, its calls queued and waiting for their batch; each call
    queued after the database clock moved past the one before (SQLite's keeps milliseconds:
    two calls in one would tie on "oldest first")."""
    claim = claimed(ledger, subject, job=job)
    for position in positions:
        ledger.calls.record_intent(claim, queued(subject, position, endpoint, estimate, tokens))
        wait_for_db_clock(ledger, ledger.now())
    ledger.batches.wait_for_batch(claim, "waiting for a batch")
    return claim


def open_batch(ledger: Ledger, key: str = "b-1", *, endpoint: str = "openai-main",
               owner: str = "submitter:1", lease: timedelta = LONG, max_requests: int = 100,
               job: str = JOB, kind: str = "openai") -> BatchClaim:
    opened = ledger.batches.open_batch(key, job=job, endpoint=endpoint, model="tiny-1",
                                       kind=kind, owner=owner, lease=lease,
                                       max_requests=max_requests, flow_run_id=None,
                                       period_start=PERIOD)
    assert opened is not None
    return opened.claim


def lease_end(ledger: Ledger, key: str) -> datetime:
    batch = ledger.batches.get(key)
    assert batch is not None and batch.lease_expires_at is not None
    return batch.lease_expires_at


def answered(text: str, cost: int = 500) -> End:
    return End("answered", Usage(100, 20, None, cost, "EUR"), answer={"text": text})


def status(ledger: Ledger, claim: Claim) -> str:
    return ledger.get(claim.run_id).status


def window(ledger: Ledger) -> dict[str, Any]:
    with ledger.engine.connect() as conn:
        row = conn.execute(sa.select(budget_windows_table)).one()
    return dict(row._mapping)


def test_a_call_is_queued_under_the_runs_lease_and_a_stale_fence_queues_nothing(
    ledger: Ledger,
) -> None:
    """The queued call is recorded with its line's id and request, neither in flight nor
    paid; an Attempt whose fence moved on gets LeaseLost and nothing is written."""
    first = claimed(ledger, "acme", lease=SHORT)
    ledger.calls.record_intent(first, queued("acme"))
    [call] = ledger.calls.of_run(first.run_id)
    assert (call.outcome, call.custom_id, call.batch_key) == ("queued", "acme-0", None)
    assert ledger.calls.since(PERIOD - timedelta(days=1)) == []  # stats: not paid, not lost
    wait_for_db_clock(ledger, first.lease_expires_at)
    assert ledger.claim(first.run_id, "w:2", LONG) is not None
    before = snapshot(ledger)
    with pytest.raises(LeaseLost):
        ledger.calls.record_intent(first, queued("acme", 1))
    assert snapshot(ledger) == before
    assert len(ledger.calls.of_run(first.run_id)) == 1


def test_a_run_that_queued_a_call_already_is_told_so_and_nothing_is_written(
    ledger: Ledger,
) -> None:
    """A second queueing of the same (position, prompt digest), even by a later Attempt after
    a crash, raises AlreadyQueued with the queued call's id; its budget is not reserved twice."""
    first = claimed(ledger, "acme", lease=SHORT)
    call = ledger.calls.record_intent(first, queued("acme", estimate=700))
    with pytest.raises(AlreadyQueued) as raised:
        ledger.calls.record_intent(first, queued("acme", estimate=700))
    assert raised.value.call_id == call.call_id
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = ledger.claim(first.run_id, "w:2", LONG)
    assert second is not None
    with pytest.raises(AlreadyQueued):
        ledger.calls.record_intent(second, queued("acme", estimate=700))
    assert len(ledger.calls.of_run(first.run_id)) == 1
    assert window(ledger)["reserved"] == 700


def test_a_waiting_run_gives_its_attempt_back_and_is_never_claimed(ledger: Ledger) -> None:
    """running -> waiting: its lease cleared, its attempt given back, its Attempt released
    with the note; register_and_claim does not claim it, and a stale fence cannot wait."""
    claim = queue(ledger, "acme")
    run = ledger.get(claim.run_id)
    assert (run.status, run.owner, run.lease_expires_at, run.attempts) == (
        "waiting", None, None, 0)
    [attempt] = ledger.attempts(claim.run_id)
    assert (attempt.outcome, attempt.error) == ("released", "waiting for a batch")
    again = register_and_claim(ledger, identity("acme"), owner="w:2", lease=LONG)
    assert again.claim is None and again.run.status == "waiting"
    assert ledger.claim(claim.run_id, "w:2", LONG) is None
    with pytest.raises(LeaseLost):
        ledger.batches.wait_for_batch(claim, "again")
    assert [r.run_id for r in ledger.batches.waiting_runs(JOB)] == [claim.run_id]
    assert [r.kind for r in ledger.unfinished(job=JOB)] == ["waiting"]


def test_a_run_none_of_whose_calls_is_still_queued_goes_pending_instead_of_waiting(
    ledger: Ledger,
) -> None:
    """A Run that asks to wait after its batch settled its calls already is pending at once:
    no waiting Run is left without a batch to release it."""
    claim = claimed(ledger, "acme")
    ledger.batches.wait_for_batch(claim, "nothing queued")
    assert status(ledger, claim) == "pending"


def test_a_batch_takes_only_the_unbatched_queued_calls_of_its_job_and_endpoint(
    ledger: Ledger,
) -> None:
    """At most max_requests of the job and endpoint's queued calls no batch holds, oldest
    first, stamped with the key; lines ordered by custom_id and their digest stable; None and
    nothing written when no call waits."""
    queue(ledger, "acme", positions=(0, 1))
    queue(ledger, "beta")
    queue(ledger, "other", endpoint="anthropic-main")
    queue(ledger, "else", job="another")
    opened = ledger.batches.open_batch("b-1", job=JOB, endpoint="openai-main", model="tiny-1",
                                       kind="openai", owner="s:1", lease=LONG, max_requests=2,
                                       flow_run_id="flow-1", period_start=PERIOD)
    assert opened is not None
    assert [line.custom_id for line in opened.lines] == ["acme-0", "acme-1"]
    assert (opened.claim.fence, opened.claim.status, opened.claim.requests) == (1, "open", 2)
    expected = document_digest([{"custom_id": line.custom_id, "request": line.request}
                                for line in opened.lines], "batch lines")
    batch = ledger.batches.get("b-1")
    assert batch is not None and batch.input_digest == expected
    assert ledger.batches.lines("b-1") == opened.lines
    second = ledger.batches.open_batch("b-2", job=JOB, endpoint="openai-main", model="tiny-1",
                                       kind="openai", owner="s:1", lease=LONG, max_requests=5,
                                       flow_run_id=None, period_start=None)
    assert second is not None and [line.custom_id for line in second.lines] == ["beta-0"]
    before = snapshot(ledger)
    assert ledger.batches.open_batch("b-3", job=JOB, endpoint="openai-main", model="tiny-1",
                                     kind="openai", owner="s:1", lease=LONG, max_requests=5,
                                     flow_run_id=None, period_start=None) is None
    assert ledger.batches.get("b-3") is None and snapshot(ledger) == before
    assert [c.custom_id for c in ledger.batches.calls_of("b-1")] == ["acme-0", "acme-1"]


def test_two_claimers_of_one_due_batch_one_fence_wins_and_the_others_writes_change_nothing(
    ledger: Ledger,
) -> None:
    """Submitted, its lease released: of two pollers one takes it (fence 2); the submitter's
    old claim can no longer poll, settle or finish it."""
    queue(ledger, "acme")
    opened = open_batch(ledger)
    assert ledger.batches.record_file(opened, "file-1", LONG) == "recorded"
    assert ledger.batches.record_submitted(opened, "batch_abc", "validating")
    with ThreadPoolExecutor(2) as pool:
        found = list(pool.map(lambda owner: ledger.batches.claim_due(owner, LONG, 10),
                              ["poller:1", "poller:2"]))
    [winner] = [claim for claims in found for claim in claims]
    assert (winner.fence, winner.status, winner.provider_batch_id, winner.provider_file_id) == (
        2, "submitted", "batch_abc", "file-1")
    assert ledger.batches.claim_batch("b-1", "poller:3", LONG) is None
    before = snapshot(ledger), ledger.batches.get("b-1")
    assert not ledger.batches.record_polled(opened, "in_progress", BatchCounts(1, 0, 0))
    assert ledger.batches.settle_results(opened, [("acme-0", answered("no"))]) == []
    with pytest.raises(LeaseLost):
        ledger.batches.finish_batch(opened, "completed")
    assert (snapshot(ledger), ledger.batches.get("b-1")) == before
    assert ledger.batches.record_polled(winner, "in_progress", BatchCounts(1, 0, 0))
    batch = ledger.batches.get("batch_abc")
    assert batch is not None and (batch.provider_status, batch.provider_total, batch.owner) == (
        "in_progress", 1, None)


def test_results_settle_each_line_once_and_nothing_under_a_stale_fence(ledger: Ledger) -> None:
    """Each custom_id of the batch still queued is settled once (a second call returns []);
    a line of another batch or unknown is not; a stale claim settles nothing."""
    claim = queue(ledger, "acme", positions=(0, 1))
    opened = open_batch(ledger, lease=SHORT)
    wait_for_db_clock(ledger, lease_end(ledger, "b-1"))
    assert ledger.batches.settle_results(opened, [("acme-0", answered("late"))]) == []
    poller = ledger.batches.claim_batch("b-1", "poller:1", LONG)
    assert poller is not None and poller.fence == 2
    ends = [("acme-0", answered("first")), ("nobody-9", answered("?")),
            ("acme-1", End("failed", error="line error"))]
    assert ledger.batches.settle_results(poller, ends) == ["acme-0", "acme-1"]
    assert ledger.batches.settle_results(poller, ends) == []
    calls = {c.custom_id: c for c in ledger.calls.of_run(claim.run_id)}
    assert (calls["acme-0"].outcome, calls["acme-0"].cost_nanos) == ("answered", 500)
    assert (calls["acme-1"].outcome, calls["acme-1"].error) == ("failed", "line error")


def test_the_budget_reserved_when_queued_settles_to_the_real_cost(ledger: Ledger) -> None:
    """Queueing reserves the estimate; the answered line's cost replaces it, a refused line
    releases it."""
    queue(ledger, "acme", estimate=1_000)
    queue(ledger, "beta", estimate=1_000)
    assert (window(ledger)["reserved"], window(ledger)["spent"]) == (2_000, 0)
    poller = open_batch(ledger)
    settled = ledger.batches.settle_results(
        poller, [("acme-0", answered("yes", cost=300)),
                 ("beta-0", End("refused", error="invalid request"))])
    assert settled == ["acme-0", "beta-0"]
    assert (window(ledger)["reserved"], window(ledger)["spent"]) == (0, 300)


def test_finishing_requeues_unanswered_calls_releases_settled_runs_and_fails_refused_ones(
    ledger: Ledger,
) -> None:
    """A call without a result line goes back to the queue (its Run keeps waiting); a Run
    whose calls all answered is pending; a Run with a refused call fails with its error; the
    batch is settled with its counts and cost, its lease released."""
    done = queue(ledger, "acme")
    refused = queue(ledger, "beta")
    left = queue(ledger, "gamma", positions=(0, 1))
    poller = open_batch(ledger)
    ledger.batches.settle_results(poller, [
        ("acme-0", answered("a", cost=200)), ("beta-0", End("refused", error="bad prompt")),
        ("gamma-0", answered("g", cost=300))])
    finished = ledger.batches.finish_batch(poller, "completed")
    assert [r.run_id for r in finished.released] == [done.run_id]
    assert [r.run_id for r in finished.failed] == [refused.run_id]
    assert finished.requeued == 1
    assert finished.released[0].subject == "acme" and finished.released[0].job == JOB
    assert (status(ledger, done), status(ledger, refused), status(ledger, left)) == (
        "pending", "failed", "waiting")
    assert ledger.get(refused.run_id).error == "bad prompt"
    batch = ledger.batches.get("b-1")
    assert batch is not None
    assert (batch.status, batch.answered, batch.refused, batch.failed, batch.requeued) == (
        "settled", 2, 1, 0, 1)
    assert (batch.cost_nanos, batch.currency, batch.owner, batch.provider_status) == (
        500, "EUR", None, "completed")
    again = ledger.batches.open_batch("b-2", job=JOB, endpoint="openai-main", model="tiny-1",
                                      kind="openai", owner="s:1", lease=LONG, max_requests=9,
                                      flow_run_id=None, period_start=None)
    assert again is not None and [line.custom_id for line in again.lines] == ["gamma-1"]
    assert ledger.batches.claim_due("poller:2", LONG, 10) == []  # b-1 settled, b-2 held
    ledger.batches.settle_results(again.claim, [("gamma-1", answered("g1"))])
    assert [r.run_id for r in ledger.batches.finish_batch(again.claim, "completed").released] == [
        left.run_id]


def test_a_withdrawn_call_releases_its_reservation_and_its_run_to_run_synchronously(
    ledger: Ledger,
) -> None:
    """A queued call its batch ended without, withdrawn (its deadline near): not billed, its
    budget reservation released, counted as withdrawn; its Run is released, marked to run
    synchronously, beside a Run released to replay its batch answer; the deadline given at
    open is the claim's."""
    deadline = PERIOD + timedelta(days=1)
    synchronous = queue(ledger, "acme", estimate=700)
    replayed = queue(ledger, "beta", estimate=700)
    opened = ledger.batches.open_batch("b-1", job=JOB, endpoint="openai-main", model="tiny-1",
                                       kind="openai", owner="s:1", lease=LONG, max_requests=9,
                                       deadline_at=deadline)
    assert opened is not None and opened.claim.deadline_at == deadline
    assert window(ledger)["reserved"] == 1400
    ledger.batches.settle_results(opened.claim, [
        ("acme-0", End(WITHDRAWN, error="its batch expired")), ("beta-0", answered("b"))])
    finished = ledger.batches.finish_batch(opened.claim, "expired")
    assert sorted(r.run_id for r in finished.released) == sorted(
        [synchronous.run_id, replayed.run_id])
    assert finished.requeued == 0 and finished.failed == []
    assert (window(ledger)["reserved"], window(ledger)["spent"]) == (0, 500)
    batch = ledger.batches.get("b-1")
    assert batch is not None and (batch.answered, batch.withdrawn, batch.requeued) == (1, 1, 0)
    assert batch.deadline_at == deadline
    released = {r.run.run_id: r.synchronous for r in ledger.batches.released_runs()}
    assert released == {synchronous.run_id: True, replayed.run_id: False}
    [call] = [c for c in ledger.batches.calls_of("b-1") if c.custom_id == "acme-0"]
    assert (call.outcome, call.cost_nanos, call.error) == (WITHDRAWN, None, "its batch expired")


def test_a_batch_takes_only_the_calls_its_endpoints_enqueued_token_limit_leaves_room_for(
    ledger: Ledger,
) -> None:
    """A limit of 1,000 enqueued prompt tokens and calls of 400: the first batch takes two;
    while it is in flight a second takes none (nothing written); once it settled, the third
    call fits; a queued call's tokens are stored with it."""
    for subject in ("acme", "beta", "gamma"):
        queue(ledger, subject, tokens=400)
    first = ledger.batches.open_batch("b-1", job=JOB, endpoint="openai-main", model="tiny-1",
                                      kind="openai", owner="s:1", lease=LONG, max_requests=9,
                                      max_tokens=1000)
    assert first is not None and [line.custom_id for line in first.lines] == ["acme-0", "beta-0"]
    assert ledger.batches.open_batch("b-2", job=JOB, endpoint="openai-main", model="tiny-1",
                                     kind="openai", owner="s:1", lease=LONG, max_requests=9,
                                     max_tokens=1000) is None
    assert ledger.batches.get("b-2") is None
    ledger.batches.settle_results(first.claim, [("acme-0", answered("a")),
                                                ("beta-0", answered("b"))])
    ledger.batches.finish_batch(first.claim, "completed")
    third = ledger.batches.open_batch("b-3", job=JOB, endpoint="openai-main", model="tiny-1",
                                      kind="openai", owner="s:1", lease=LONG, max_requests=9,
                                      max_tokens=1000)
    assert third is not None and [line.custom_id for line in third.lines] == ["gamma-0"]
    assert {c.queued_tokens for c in ledger.batches.calls_of("b-3")} == {400}


def test_a_submitter_whose_lease_ran_out_while_uploading_creates_no_batch(
    ledger: Ledger, batch_server: BatchServer,
) -> None:
    """The submitter's lease ends while its file uploads and a poller takes the batch over:
    storing the late file id is refused, so the submitter raises LeaseLost before any create;
    the new holder uploads, stores its file id (its lease extended) and creates the one batch."""
    queue(ledger, "acme")
    opened = ledger.batches.open_batch("b-1", job=JOB, endpoint="openai-main", model="tiny-1",
                                       kind="openai", owner="s:1", lease=SHORT, max_requests=9)
    assert opened is not None
    wait_for_db_clock(ledger, lease_end(ledger, "b-1"))
    [taken] = ledger.batches.claim_due("poller:1", LONG, 10)
    client = OpenAIBatchClient(batch_server.base_url, "tiny-1", SecretStr("sk-test"))
    try:
        with pytest.raises(LeaseLost, match="lost its lease before its create"):
            submit(ledger, client, opened.claim, opened.lines, LONG.total_seconds())
        assert batch_server.created == [] and len(batch_server.files) == 1
        remote = submit(ledger, client, taken, ledger.batches.lines("b-1"),
                        LONG.total_seconds())
    finally:
        client.close()
    assert batch_server.created == [remote.id] and dict(batch_server.creates_by_key) == {"b-1": 1}
    batch = ledger.batches.get("b-1")
    assert batch is not None and (batch.status, batch.provider_batch_id) == (
        "submitted", remote.id)


def test_a_taker_whose_lease_ran_out_before_it_looked_creates_nothing(
    ledger: Ledger, batch_server: BatchServer,
) -> None:
    """A batch whose file id is stored and create in doubt, taken over twice: the first taker's
    lease ran out before it looked at the provider, so it raises LeaseLost and sends no create;
    the second looks, finds nothing and creates the one batch."""
    queue(ledger, "acme")
    opened = ledger.batches.open_batch("b-1", job=JOB, endpoint="openai-main", model="tiny-1",
                                       kind="openai", owner="s:1", lease=SHORT, max_requests=9)
    assert opened is not None
    client = OpenAIBatchClient(batch_server.base_url, "tiny-1", SecretStr("sk-test"))
    try:
        file_id = client.upload("b-1", [(line.custom_id, line.request) for line in opened.lines])
        assert ledger.batches.record_file(opened.claim, file_id, SHORT.total_seconds()) == \
            "recorded"
        wait_for_db_clock(ledger, lease_end(ledger, "b-1"))
        [stale] = ledger.batches.claim_due("poller:1", SHORT, 10)
        wait_for_db_clock(ledger, lease_end(ledger, "b-1"))
        [taken] = ledger.batches.claim_due("poller:2", LONG, 10)
        assert (stale.fence, taken.fence, taken.provider_file_id) == (2, 3, file_id)
        with pytest.raises(LeaseLost, match="lost its lease before its create"):
            submit(ledger, client, stale, ledger.batches.lines("b-1"), LONG.total_seconds())
        assert batch_server.created == []
        remote = submit(ledger, client, taken, ledger.batches.lines("b-1"),
                        LONG.total_seconds())
    finally:
        client.close()
    assert batch_server.created == [remote.id] and dict(batch_server.creates_by_key) == {"b-1": 1}


def test_an_expired_batch_lease_lets_another_claimer_in(ledger: Ledger) -> None:
    """The submitter's lease ends by the database clock: a poller takes the open batch (fence
    2) and rebuilds its file from its lines; the submitter's late writes change nothing."""
    queue(ledger, "acme")
    opened = open_batch(ledger, lease=SHORT)
    assert ledger.batches.claim_due("poller:1", LONG, 10) == []
    wait_for_db_clock(ledger, lease_end(ledger, "b-1"))
    [taken] = ledger.batches.claim_due("poller:1", LONG, 10)
    assert (taken.key, taken.fence, taken.status, taken.owner) == ("b-1", 2, "open", "poller:1")
    assert [line.custom_id for line in ledger.batches.lines("b-1")] == ["acme-0"]
    assert ledger.batches.record_file(opened, "file-late", LONG) == "lost"
    assert not ledger.batches.record_submitted(opened, "batch-late", "validating")
    assert ledger.batches.record_submitted(taken, "batch_1", "validating")
    batch = ledger.batches.get("b-1")
    assert batch is not None and (batch.provider_batch_id, batch.status) == (
        "batch_1", "submitted")


def test_a_released_run_is_claimed_again_and_replays_its_settled_answer(ledger: Ledger) -> None:
    """After its batch settled, the pending Run is claimed by the next tick and the checkpoint
    of its queued call is handed back by position and prompt digest."""
    first = queue(ledger, "acme")
    poller = open_batch(ledger)
    ledger.batches.settle_results(poller, [("acme-0", answered("from the batch"))])
    ledger.batches.finish_batch(poller, "completed")
    again = register_and_claim(ledger, identity("acme"), owner="w:2", lease=LONG)
    assert again.claim is not None and again.claim.fence == first.fence + 1
    found = ledger.calls.replay(again.claim, 0, digest("summarize acme 0"))
    assert found is not None and found.answer == {"text": "from the batch"}
    assert ledger.get(first.run_id).attempts == 1


def test_migration_0016_keeps_the_calls_made_before_and_its_downgrade_forgets_the_queue(
        empty_db_url: str) -> None:
    """A call recorded at 0015 reads, after 0016, as one in no batch; downgrading to 0015
    deletes the calls still queued (none left), sends the waiting Runs back to pending, keeps
    the calls a batch answered and drops the batches."""
    from alembic import command
    from alembic.config import Config

    from store.ledger import MIGRATIONS

    with Ledger.connect(empty_db_url) as ledger:
        ledger.migrate("0015")
        old = claimed(ledger, "old")
        with ledger.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO model_calls (call_id, run_id, attempt_id, fence, job, endpoint, "
                "model, position, prompt_digest, started_at, outcome) VALUES ('c1', :run, "
                ":attempt, 1, 'digest', 'e', 'm', 0, 'd', :now, 'answered')"),
                {"run": old.run_id, "attempt": old.attempt_id,
                 "now": PERIOD.replace(tzinfo=None)})
        ledger.migrate()
        [call] = ledger.calls.of_run(old.run_id)
        assert (call.outcome, call.batch_key, call.custom_id) == ("answered", None, None)
        settled = queue(ledger, "acme")
        waiting = queue(ledger, "beta")
        poller = open_batch(ledger)
        ledger.batches.settle_results(poller, [("acme-0", answered("kept"))])
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with ledger.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0015")
        assert "batches" not in sa.inspect(ledger.engine).get_table_names()
        with ledger.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT run_id, outcome FROM model_calls")).all()
            statuses: dict[str, str] = {
                run_id: run_status for run_id, run_status
                in conn.execute(sa.text("SELECT run_id, status FROM runs")).all()}
        assert sorted(outcome for _, outcome in rows) == ["answered", "answered"]
        assert (statuses[settled.run_id], statuses[waiting.run_id]) == ("pending", "pending")


def test_one_inline_create_at_a_time_is_in_doubt_per_kind(ledger: Ledger) -> None:
    """An Anthropic batch whose inline file is stored and its provider id not yet has its
    create in doubt: a second one of that kind is ``busy`` (its lease given back, nothing
    stored) until the first's id is stored; an OpenAI batch is never held back."""
    queue(ledger, "acme", endpoint="claude")
    first = open_batch(ledger, "b-1", endpoint="claude", kind="anthropic")
    queue(ledger, "beta", endpoint="claude")
    second = open_batch(ledger, "b-2", endpoint="claude", kind="anthropic")
    queue(ledger, "gamma")
    other = open_batch(ledger, "b-3")
    assert ledger.batches.record_file(first, "inline", LONG) == "recorded"
    assert ledger.batches.record_file(second, "inline", LONG) == "busy"
    held_back = ledger.batches.get("b-2")
    assert held_back is not None and held_back.provider_file_id is None
    assert held_back.lease_expires_at is not None and held_back.lease_expires_at <= ledger.now()
    assert ledger.batches.record_file(other, "file-9", LONG) == "recorded"
    assert ledger.batches.record_submitted(first, "msgbatch_1", "in_progress")
    due = {claim.key: claim for claim in ledger.batches.claim_due("poller:1", LONG, 10)}
    assert set(due) == {"b-1", "b-2"}  # the submitted one to poll, the held-back one to create
    again = due["b-2"]
    assert ledger.batches.record_file(again, "inline", LONG) == "recorded"


def test_a_create_the_provider_refused_is_no_longer_in_doubt(ledger: Ledger) -> None:
    """Forgetting a refused create's inline file lets the next batch of its kind be created;
    only the holder of the batch's lease can."""
    queue(ledger, "acme", endpoint="claude")
    first = open_batch(ledger, "b-1", endpoint="claude", kind="anthropic")
    queue(ledger, "beta", endpoint="claude")
    second = open_batch(ledger, "b-2", endpoint="claude", kind="anthropic", owner="s:2")
    assert ledger.batches.record_file(first, "inline", LONG) == "recorded"
    stranger = BatchClaim(**{**first.__dict__, "owner": "someone-else"})
    assert not ledger.batches.forget_file(stranger)
    assert ledger.batches.forget_file(first)
    assert ledger.batches.record_file(second, "inline", LONG) == "recorded"


def test_a_call_its_batch_answered_after_a_takeover_looked_is_never_queued_again(
    ledger: Ledger,
) -> None:
    """A later Attempt that looked for an answer to replay just before the batch settled the
    call is told AlreadyAnswered when it queues it again: nothing is written, no second call
    with the same custom_id goes into another batch, and the answer is then replayed."""
    first = claimed(ledger, "acme", lease=SHORT)
    ledger.calls.record_intent(first, queued("acme"))
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = ledger.claim(first.run_id, "w:2", LONG)
    assert second is not None
    assert ledger.calls.replay(second, 0, digest("summarize acme 0")) is None  # not answered yet
    opened = open_batch(ledger)
    assert ledger.batches.record_file(opened, "file-1", LONG) == "recorded"
    assert ledger.batches.record_submitted(opened, "batch_abc", "validating")
    poller = ledger.batches.claim_batch("b-1", "poller:1", LONG)
    assert poller is not None
    assert ledger.batches.settle_results(poller, [("acme-0", answered("yes"))]) == ["acme-0"]
    before = snapshot(ledger)
    with pytest.raises(AlreadyAnswered) as raised:
        ledger.calls.record_intent(second, queued("acme"))
    assert snapshot(ledger) == before
    [call] = ledger.calls.of_run(first.run_id)
    assert raised.value.call_id == call.call_id and call.outcome == "answered"
    replayed = ledger.calls.replay(second, 0, digest("summarize acme 0"))
    assert replayed is not None and replayed.answer == {"text": "yes"}
    assert open_batch_or_none(ledger, "b-2") is None  # nothing left to put in a batch


def open_batch_or_none(ledger: Ledger, key: str) -> object:
    return ledger.batches.open_batch(key, job=JOB, endpoint="openai-main", model="tiny-1",
                                     kind="openai", owner="submitter:2", lease=LONG,
                                     max_requests=100, flow_run_id=None, period_start=PERIOD)
