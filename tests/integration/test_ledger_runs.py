"""Run transitions on both dialects: idempotent register, fenced leases judged by the database
clock, completion with its outbox rows, failures, and bad input that writes nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from store import (
    Claim,
    FinishedRun,
    InvalidInput,
    LeaseLost,
    Ledger,
    OutboxMessage,
    Run,
    RunConflict,
    RunIdentity,
)
from store.columns import UTCDateTime
from store.dialect import db_now
from store.errors import InvalidMessage, InvalidTransition, OutputTooLarge, RunNotFound
from store.models import runs_table
from tests.support.ledger import snapshot, wait_for_db_clock

PERIOD = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)
LONG = timedelta(minutes=15)
SHORT = timedelta(seconds=1)
RECIPIENTS = ["ana@example.com", "ben@example.com"]


def identity(subject: str = "team-a", period: datetime = PERIOD) -> RunIdentity:
    return RunIdentity("digest", subject, period, "v1")


def digest(recipients: list[str] = RECIPIENTS) -> list[OutboxMessage]:
    return [OutboxMessage(r, "Daily digest", "3 new items") for r in recipients]


def claimed(ledger: Ledger, run: Run, owner: str = "worker-1:101", lease: timedelta = LONG) -> Claim:
    claim = ledger.claim(run.run_id, owner, lease)
    assert claim is not None
    return claim


def test_same_logical_run_twice_keeps_one_row_the_first_output_and_one_message_per_recipient(
    ledger: Ledger,
) -> None:
    """A second execution of a completed Run stores nothing: the first output and its outbox
    rows stay, one per recipient."""
    params = {"recipients": RECIPIENTS, "model": "small"}
    first = ledger.register(identity(), params)
    claim = claimed(ledger, first)
    ledger.save_input(claim, {"items": [1, 2, 3]})
    done = ledger.complete(claim, {"summary": "first"}, digest())
    assert done.new and done.run.output == {"summary": "first"}

    again = ledger.register(identity(), params)
    assert again.run_id == first.run_id and again.status == "completed"
    assert ledger.claim(again.run_id, "worker-2:202", LONG) is None
    replay = ledger.complete(claim, {"summary": "second, different"}, digest())
    assert not replay.new and replay.run.output == {"summary": "first"}

    rows = snapshot(ledger)
    assert len(rows["runs"]) == 1 and rows["runs"][0]["output"] == {"summary": "first"}
    assert sorted(m["recipient"] for m in rows["outbox"]) == RECIPIENTS
    assert len({m["message_id"] for m in rows["outbox"]}) == len(RECIPIENTS)


def test_register_creates_a_pending_run_with_the_identity_and_params(ledger: Ledger) -> None:
    """A new identity becomes one pending Run with fence 0 and no attempts."""
    run = ledger.register(identity(), {"recipients": RECIPIENTS})
    assert (run.status, run.fence, run.attempts, run.owner) == ("pending", 0, 0, None)
    assert run.run_id == identity().run_id and run.period_start == PERIOD
    assert run.params == {"recipients": RECIPIENTS}
    assert ledger.get(run.run_id) == run


def test_register_with_changed_params_under_the_same_key_is_a_conflict_writing_nothing(
    ledger: Ledger,
) -> None:
    """Same identity, different parameters: RunConflict, and the stored Run is untouched."""
    ledger.register(identity(), {"recipients": RECIPIENTS})
    before = snapshot(ledger)
    with pytest.raises(RunConflict, match="already exists with different parameters"):
        ledger.register(identity(), {"recipients": ["eve@example.com"]})
    assert snapshot(ledger) == before


def test_claim_bumps_the_fence_counts_the_attempt_and_records_it(ledger: Ledger) -> None:
    """A claim takes the lease by the database clock and opens an Attempt row."""
    run = ledger.register(identity())
    before = ledger.database.now()
    claim = claimed(ledger, run, lease=LONG)
    stored = ledger.get(run.run_id)
    assert (stored.status, stored.fence, stored.attempts, stored.owner) == (
        "running", 1, 1, "worker-1:101"
    )
    assert before + LONG <= claim.lease_expires_at <= ledger.database.now() + LONG
    [attempt] = ledger.attempts(run.run_id)
    assert (attempt.attempt_id, attempt.fence, attempt.owner, attempt.outcome) == (
        claim.attempt_id, 1, "worker-1:101", None
    )


def test_a_live_lease_is_not_reclaimed_by_another_owner(ledger: Ledger) -> None:
    """While the lease lasts, another worker gets no claim and nothing changes."""
    run = ledger.register(identity())
    claimed(ledger, run)
    before = snapshot(ledger)
    assert ledger.claim(run.run_id, "worker-2:202", LONG) is None
    assert snapshot(ledger) == before


def test_an_expired_lease_is_reclaimed_with_a_new_fence(ledger: Ledger) -> None:
    """After expiry by the database clock a second worker claims: fence 2, attempts 2, and the
    first Attempt is closed as expired."""
    run = ledger.register(identity())
    first = claimed(ledger, run, lease=SHORT)
    assert ledger.claim(run.run_id, "worker-2:202", LONG) is None
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = claimed(ledger, run, owner="worker-2:202")
    stored = ledger.get(run.run_id)
    assert (second.fence, stored.fence, stored.attempts, stored.owner) == (2, 2, 2, "worker-2:202")
    outcomes = [(a.fence, a.outcome) for a in ledger.attempts(run.run_id)]
    assert outcomes == [(1, "expired"), (2, None)]


def test_the_stale_owner_can_neither_save_renew_complete_nor_fail(ledger: Ledger) -> None:
    """Once the fence moved on, every write of the old holder raises LeaseLost and changes
    nothing (the whole ledger is compared before and after)."""
    run = ledger.register(identity())
    stale = claimed(ledger, run, lease=SHORT)
    wait_for_db_clock(ledger, stale.lease_expires_at)
    current = claimed(ledger, run, owner="worker-2:202")
    ledger.save_input(current, {"items": ["winner"]})
    before = snapshot(ledger)
    with pytest.raises(LeaseLost):
        ledger.save_input(stale, {"items": ["stale"]})
    assert ledger.renew_many([stale], LONG) == {}  # a stale claim is left out, not renewed
    with pytest.raises(LeaseLost):
        ledger.complete(stale, {"summary": "stale"}, digest())
    with pytest.raises(LeaseLost):
        ledger.fail(stale, "stale failure", retryable=True)
    with pytest.raises(LeaseLost):
        ledger.fail(stale, "stale failure", retryable=False)
    assert snapshot(ledger) == before


def test_the_same_owner_reclaiming_gets_a_new_fence_and_its_old_claim_goes_stale(
    ledger: Ledger,
) -> None:
    """A lease that is already ours can be re-taken; only the newest fence may write."""
    run = ledger.register(identity())
    old = claimed(ledger, run)
    new = claimed(ledger, run)
    assert new.fence == old.fence + 1
    assert ledger.renew_many([old], LONG) == {}
    assert ledger.renew_many([new], LONG)[new.run_id] > new.lease_expires_at - LONG


def test_renew_extends_the_lease_from_the_database_clock(ledger: Ledger) -> None:
    """Renewing keeps a live lease from expiring: another worker still cannot claim."""
    run = ledger.register(identity())
    claim = claimed(ledger, run, lease=SHORT)
    expires = ledger.renew_many([claim], LONG)[claim.run_id]
    assert expires >= ledger.database.now() + LONG - timedelta(seconds=5)
    wait_for_db_clock(ledger, claim.lease_expires_at)
    assert ledger.claim(run.run_id, "worker-2:202", LONG) is None


def test_save_input_keeps_the_first_input_and_returns_it(ledger: Ledger) -> None:
    """Raw input is stored once; a later save returns the stored input, not its own."""
    run = ledger.register(identity())
    claim = claimed(ledger, run)
    assert ledger.save_input(claim, {"items": [1]}) == {"items": [1]}
    assert ledger.save_input(claim, {"items": [2]}) == {"items": [1]}
    assert ledger.get(run.run_id).raw_input == {"items": [1]}


def test_a_new_holder_continues_with_the_input_the_expired_holder_saved(ledger: Ledger) -> None:
    """The reclaiming worker gets the first worker's raw input back (first writer wins)."""
    run = ledger.register(identity())
    first = claimed(ledger, run, lease=SHORT)
    ledger.save_input(first, {"items": ["collected first"]})
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = claimed(ledger, run, owner="worker-2:202")
    assert ledger.save_input(second, {"items": ["collected again"]}) == {"items": ["collected first"]}


def test_complete_clears_the_lease_and_queues_one_outbox_row_per_recipient(ledger: Ledger) -> None:
    """Completion stores the output, closes the Attempt and queues each recipient once, each
    with its stable idempotency key."""
    run = ledger.register(identity())
    claim = claimed(ledger, run)
    messages = [*digest(), OutboxMessage(RECIPIENTS[0], "duplicate recipient", "ignored")]
    done = ledger.complete(claim, {"summary": "ok"}, messages)
    assert done.new
    assert (done.run.status, done.run.owner, done.run.lease_expires_at) == ("completed", None, None)
    assert done.run.completed_attempt_id == claim.attempt_id and done.run.completed_at is not None
    [attempt] = ledger.attempts(run.run_id)
    assert attempt.outcome == "completed" and attempt.finished_at is not None
    queued = ledger.outbox.messages(run_id=run.run_id)
    assert sorted(m.recipient for m in queued) == RECIPIENTS
    assert {m.subject for m in queued} == {"Daily digest"}
    assert all(m.status == "pending" and m.next_attempt_at is not None for m in queued)


def test_a_retryable_failure_releases_the_lease_for_the_next_attempt(ledger: Ledger) -> None:
    """fail(retryable=True) puts the Run back to pending; the next claim gets fence 2."""
    run = ledger.register(identity())
    claim = claimed(ledger, run)
    failed = ledger.fail(claim, "model timed out", retryable=True)
    assert (failed.status, failed.owner, failed.error) == ("pending", None, "model timed out")
    again = claimed(ledger, run, owner="worker-2:202")
    assert again.fence == 2
    assert [(a.outcome, a.error) for a in ledger.attempts(run.run_id)] == [
        ("released", "model timed out"), (None, None)
    ]


def test_a_permanent_failure_stops_claims_until_an_operator_requeues(ledger: Ledger) -> None:
    """fail(retryable=False) marks the Run failed; only requeue makes it claimable again."""
    run = ledger.register(identity())
    ledger.fail(claimed(ledger, run), "invalid model output", retryable=False)
    assert ledger.get(run.run_id).status == "failed"
    assert ledger.claim(run.run_id, "worker-2:202", LONG) is None
    assert ledger.requeue_run(run.run_id).status == "pending"
    assert claimed(ledger, run, owner="worker-2:202").fence == 2


def test_requeue_of_a_run_that_is_not_failed_is_refused(ledger: Ledger) -> None:
    """Requeue only moves failed Runs; a pending or completed Run stays as it is."""
    run = ledger.register(identity())
    with pytest.raises(InvalidTransition, match="only a failed run can be requeued"):
        ledger.requeue_run(run.run_id)
    ledger.complete(claimed(ledger, run), {"summary": "ok"})
    with pytest.raises(InvalidTransition):
        ledger.requeue_run(run.run_id)
    assert ledger.get(run.run_id).status == "completed"


def test_unknown_run_id_is_a_clear_error(ledger: Ledger) -> None:
    """Claiming, requeueing or requiring a Run that does not exist raises RunNotFound."""
    missing = "0" * 64
    with pytest.raises(RunNotFound, match=missing):
        ledger.claim(missing, "worker-1:101", LONG)
    with pytest.raises(RunNotFound):
        ledger.requeue_run(missing)
    with pytest.raises(RunNotFound):
        ledger.get(missing)
    assert ledger.get_many([missing]) == {}
    assert snapshot(ledger) == {"runs": [], "attempts": [], "outbox": []}


def test_oversized_output_is_refused_and_nothing_is_written(db_url: str) -> None:
    """Output above the configured byte limit raises OutputTooLarge; the Run stays running."""
    ledger = Ledger.connect(db_url, max_output_bytes=200)
    try:
        run = ledger.register(identity())
        claim = claimed(ledger, run)
        before = snapshot(ledger)
        with pytest.raises(OutputTooLarge, match="above the configured limit of 200 bytes"):
            ledger.complete(claim, {"summary": "x" * 500}, digest())
        with pytest.raises(OutputTooLarge):
            ledger.save_input(claim, {"items": "y" * 500})
        assert snapshot(ledger) == before
    finally:
        ledger.close()


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        (["not", "an", "object"], "must be a dict"),
        ({"when": datetime(2026, 1, 1, tzinfo=UTC)}, "JSON-serializable"),
        ({"score": float("nan")}, "JSON-serializable"),
        ({"text": "nul\0inside"}, "NUL"),
    ],
)
def test_output_that_is_not_a_json_object_is_refused(ledger: Ledger, output: Any, problem: str) -> None:
    """Only a JSON object without NaN or NUL is an output; anything else writes nothing."""
    run = ledger.register(identity())
    claim = claimed(ledger, run)
    before = snapshot(ledger)
    with pytest.raises(InvalidInput, match=problem):
        ledger.complete(claim, output)
    assert snapshot(ledger) == before


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: OutboxMessage("not-an-address", "s", "b"), "not a valid email address"),
        (lambda: OutboxMessage("a@example.com\r\nBcc: eve@example.com", "s", "b"), "CR, LF"),
        (lambda: OutboxMessage("a@example.com", "hi\r\nBcc: eve@example.com", "b"), "CR, LF"),
        (lambda: OutboxMessage("a@example.com", "=?utf-8?q?hi?=", "b"), "encoded word"),
        (lambda: OutboxMessage("a@example.com", "s", "b", headers={"Bcc": "eve@example.com"}),
         "set by the dispatcher"),
    ],
)
def test_invalid_outbox_message_is_refused_before_anything_is_written(
    ledger: Ledger, make: Any, problem: str
) -> None:
    """A bad address or an injectable header is refused when the message is built, so the
    completion never happens."""
    run = ledger.register(identity())
    claim = claimed(ledger, run)
    before = snapshot(ledger)
    with pytest.raises(InvalidMessage, match=problem):
        ledger.complete(claim, {"summary": "ok"}, [make()])
    assert snapshot(ledger) == before


def test_a_message_that_is_not_an_outbox_message_is_refused(ledger: Ledger) -> None:
    """complete() takes OutboxMessage objects only; a dict is refused and nothing is written."""
    run = ledger.register(identity())
    claim = claimed(ledger, run)
    before = snapshot(ledger)
    with pytest.raises(InvalidInput, match="must be OutboxMessage objects"):
        ledger.complete(claim, {"summary": "ok"}, [{"recipient": "a@example.com"}])  # type: ignore[list-item]
    assert snapshot(ledger) == before


@pytest.mark.parametrize("lease", [timedelta(0), timedelta(seconds=-5), timedelta(days=400)])
def test_a_lease_out_of_range_is_refused(ledger: Ledger, lease: timedelta) -> None:
    """Leases must be positive and at most a year: nothing is claimed otherwise."""
    run = ledger.register(identity())
    with pytest.raises(InvalidInput, match="lease"):
        ledger.claim(run.run_id, "worker-1:101", lease)
    assert ledger.get(run.run_id).fence == 0


@pytest.mark.parametrize("owner", ["", "   ", "x" * 301, "nul\0owner"])
def test_a_bad_owner_is_refused(ledger: Ledger, owner: str) -> None:
    """An owner must be non-empty text that fits its column; nothing is claimed otherwise."""
    run = ledger.register(identity())
    with pytest.raises(InvalidInput, match="owner must be"):
        ledger.claim(run.run_id, owner, LONG)
    assert ledger.get(run.run_id).fence == 0


def test_a_naive_datetime_reaching_the_database_layer_is_refused(ledger: Ledger) -> None:
    """Even below the API, a naive timestamp never reaches a column: the typed column refuses it
    with our error, and the transaction writes nothing."""
    with pytest.raises(InvalidInput, match="timestamp must be timezone-aware"):
        ledger.database.write(
            lambda conn: conn.execute(
                sa.update(runs_table).values(updated_at=datetime(2026, 1, 1))
            )
        )


def test_fail_requires_an_error_text(ledger: Ledger) -> None:
    """A failure must say what failed; an empty error is refused and the lease is kept."""
    run = ledger.register(identity())
    claim = claimed(ledger, run)
    with pytest.raises(InvalidInput, match="error must be a non-empty string"):
        ledger.fail(claim, "  ")
    assert ledger.get(run.run_id).status == "running"


def test_runs_are_listed_by_job_and_status(ledger: Ledger) -> None:
    """runs() filters by job and status, newest period first."""
    older = ledger.register(identity(period=PERIOD - timedelta(days=1)))
    newer = ledger.register(identity())
    other = ledger.register(RunIdentity("other-job", "team-a", PERIOD, "v1"))
    ledger.complete(claimed(ledger, newer), {"summary": "ok"})
    assert [r.run_id for r in ledger.runs(job="digest")] == [newer.run_id, older.run_id]
    assert [r.run_id for r in ledger.runs(status="pending")] == [other.run_id, older.run_id]
    assert ledger.get_many([older.run_id, newer.run_id, "missing"]).keys() == {
        older.run_id, newer.run_id
    }


def test_finished_reads_the_completed_and_failed_runs_of_many_ids_without_their_raw_inputs(
        ledger: Ledger) -> None:
    """finished() answers for 1,200 ids at once (more than one query's worth): the completed
    and the failed Runs, with output, attempts, error and fingerprint, and no raw input; pending,
    running and unknown ids are left out."""
    made = [ledger.register(identity(subject=f"team-{i:04d}")) for i in range(1_200)]
    done, failed, running = made[0], made[600], made[1_100]
    claims = {r.run_id: claimed(ledger, r) for r in (done, failed, running)}
    for claim in claims.values():
        ledger.save_input(claim, {"doc": claim.run_id})
    ledger.complete(claims[done.run_id], {"summary": "ok"})
    ledger.fail(claims[failed.run_id], "ValidationFailed: empty", retryable=False)
    found = ledger.finished([r.run_id for r in made] + ["missing"])
    assert found == {
        done.run_id: FinishedRun(done.run_id, "completed", done.params_fingerprint, 1,
                                 {"summary": "ok"}, None),
        failed.run_id: FinishedRun(failed.run_id, "failed", failed.params_fingerprint, 1,
                                   None, "ValidationFailed: empty"),
    }
    assert not hasattr(found[done.run_id], "raw_input")


def test_database_clock_is_timezone_aware_utc(ledger: Ledger) -> None:
    """The database clock comes back aware, in UTC, close to this host's clock."""
    now = ledger.database.now()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert abs(now - datetime.now(UTC)) < timedelta(minutes=5)


def test_registering_many_subjects_keeps_them_apart(ledger: Ledger) -> None:
    """Distinct subjects of the same period are distinct Runs."""
    subjects = [f"team-{uuid.uuid4().hex[:6]}" for _ in range(5)]
    ids = {ledger.register(identity(s)).run_id for s in subjects}
    assert len(ids) == 5 and len(snapshot(ledger)["runs"]) == 5


def test_a_time_read_from_the_database_clock_is_never_after_the_clock(ledger: Ledger) -> None:
    """Stored timestamps and the database clock compare as instants (on SQLite both are text of
    one shape, so that text order is time order): a clock reading stored back is at or before
    the clock, even within the same millisecond."""

    def stored_is_not_after_clock(conn: sa.Connection) -> bool:
        now = conn.execute(sa.select(db_now())).scalar_one()
        return bool(conn.execute(sa.select(sa.literal(now, UTCDateTime()) <= db_now())).scalar_one())

    assert all(ledger.database.write(stored_is_not_after_clock) for _ in range(50))
