"""Explicit revisions in the ledger, on both dialects: a completed Run's next revision is a new
row of the same identity, inserted by one guarded statement that allows at most one unfinished
revision per Run; reads of the result return the latest completed revision."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from hashlib import sha256

import pytest
import sqlalchemy as sa

from store import (
    InvalidInput,
    Ledger,
    OutboxMessage,
    RevisionInProgress,
    RevisionRefused,
    Run,
    RunConflict,
    RunIdentity,
)
from store.models import runs_table

PERIOD = datetime(2026, 11, 29, tzinfo=UTC)
LEASE = timedelta(minutes=5)
PARAMS = {"recipients": ["ana@example.com"]}


def identity(subject: str = "team-a") -> RunIdentity:
    return RunIdentity("digest", subject, PERIOD, "v1")


def finish(ledger: Ledger, run: Run, text: str, raw: dict[str, str] | None = None) -> Run:
    """Claim, collect (unless the Run holds its input) and complete ``run`` with one message."""
    claim = ledger.claim(run.run_id, "worker:1", LEASE)
    assert claim is not None
    if run.raw_input is None:
        ledger.save_input(claim, raw or {"items": "a, b"})
    done = ledger.complete(claim, {"text": text}, [OutboxMessage("ana@example.com", "Digest", text)])
    return done.run


def completed(ledger: Ledger, subject: str = "team-a") -> Run:
    return finish(ledger, ledger.register(identity(subject), PARAMS), "first")


def row_count(ledger: Ledger) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(runs_table)).scalar_one())


def test_revision_zero_keeps_the_run_id_it_always_had() -> None:
    """Existing ledgers keep their ids: revision 0 hashes the four fields as before, and each
    revision N has a stable id of its own."""
    original = identity()
    assert original.run_id == RunIdentity("digest", "team-a", PERIOD, "v1", 0).run_id
    assert original.run_id == sha256(b"digest|team-a|2026-11-29T00:00:00+00:00|v1").hexdigest()
    first, again = original.revised(1), RunIdentity("digest", "team-a", PERIOD, "v1", 1)
    assert first.run_id == again.run_id and first.run_id != original.run_id
    assert original.revised(2).run_id not in (original.run_id, first.run_id)
    with pytest.raises(InvalidInput, match="revision"):
        RunIdentity("digest", "team-a", PERIOD, "v1", -1)


def test_a_revision_of_a_completed_run_is_a_new_pending_row_linked_to_it_with_its_input(
        ledger: Ledger) -> None:
    """The revision is row revision 1 of the same identity, pending, with the reason, the
    original's params and a copy of its stored raw input; the original is unchanged."""
    original = completed(ledger)
    revision = ledger.request_revision(original.run_id, "model fixed", requested_by="req-1")
    run = ledger.get(revision.run.run_id)
    assert revision.new and run.run_id == identity().revised(1).run_id
    assert (run.revision, run.revises_run_id, run.revision_reason, run.status) == (
        1, original.run_id, "model fixed", "pending")
    assert run.params == PARAMS and run.raw_input == {"items": "a, b"} and run.output is None
    assert ledger.get(original.run_id) == original


def test_recollect_leaves_the_revision_without_a_stored_input(ledger: Ledger) -> None:
    """With recollect the revision's collect stage runs again; the resend choice is kept on
    the revision for whoever resumes it."""
    original = completed(ledger)
    revision = ledger.request_revision(original.run_id, "source fixed", recollect=True,
                                       resend=False)
    run = ledger.get(revision.run.run_id)
    assert run.raw_input is None and run.resend is False


def test_a_second_request_while_a_revision_is_unfinished_is_refused_naming_it(
        ledger: Ledger) -> None:
    """At most one unfinished revision per Run: the refusal names the pending revision, its
    status and how to resume it; nothing is written."""
    original = completed(ledger)
    first = ledger.request_revision(original.run_id, "one").run
    with pytest.raises(RevisionInProgress, match=rf"revision 1 \(run {first.run_id}\) still "
                                                 r"pending.*runledger runs revise"):
        ledger.request_revision(first.run_id, "two")
    assert row_count(ledger) == 2


def test_the_same_request_again_returns_its_revision_instead_of_a_second_one(
        ledger: Ledger) -> None:
    """A retried revise flow run (same requester) resumes its revision, finished or not."""
    original = completed(ledger)
    first = ledger.request_revision(original.run_id, "one", requested_by="flow-run-1")
    again = ledger.request_revision(original.run_id, "one", requested_by="flow-run-1")
    assert not again.new and again.run.run_id == first.run.run_id
    finish(ledger, ledger.get(first.run.run_id), "second")
    assert ledger.request_revision(original.run_id, "one", requested_by="flow-run-1").run \
        .status == "completed"
    assert row_count(ledger) == 2


def test_revising_a_run_that_never_completed_is_refused_and_writes_nothing(
        ledger: Ledger) -> None:
    """A pending Run is rerun, a failed one requeued: the refusal says which."""
    pending = ledger.register(identity("team-b"), PARAMS)
    with pytest.raises(RevisionRefused, match=r"pending, never completed.*rerun its period"):
        ledger.request_revision(pending.run_id, "why")
    claim = ledger.claim(pending.run_id, "worker:1", LEASE)
    assert claim is not None
    ledger.fail(claim, "bad input", retryable=False)
    with pytest.raises(RevisionRefused, match="runledger runs requeue"):
        ledger.request_revision(pending.run_id, "why")
    with pytest.raises(InvalidInput, match="reason"):
        ledger.request_revision(pending.run_id, "  ")
    assert row_count(ledger) == 1


def test_two_concurrent_requests_make_one_revision(ledger: Ledger) -> None:
    """Both ask for revision 1 at once: the identity key lets exactly one insert it, the other
    is told the revision is in progress."""
    original = completed(ledger)
    start = threading.Barrier(2)
    results: list[object] = []

    def ask(n: int) -> None:
        start.wait()
        try:
            results.append(ledger.request_revision(original.run_id, f"ask {n}",
                                                   requested_by=f"req-{n}"))
        except RevisionInProgress as exc:
            results.append(exc)

    threads = [threading.Thread(target=ask, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(r).__name__ for r in results) == ["Revision", "RevisionInProgress"]
    assert [r.revision for r in ledger.revisions(original.run_id)] == [0, 1]


def test_the_database_refuses_a_second_row_for_one_revision(ledger: Ledger) -> None:
    """The identity constraint now includes the revision: a raw insert of revision 1 twice,
    under another id, is refused."""
    original = completed(ledger)
    revision = ledger.get(ledger.request_revision(original.run_id, "one").run.run_id)
    copy = {**revision.model_dump(), "run_id": "f" * 64}
    with pytest.raises(sa.exc.IntegrityError), ledger.engine.begin() as conn:
        conn.execute(sa.insert(runs_table).values(**copy))


def test_reads_of_the_result_return_the_latest_completed_revision(ledger: Ledger) -> None:
    """A rerun's read of the period finds revision 1's output once it completed, and the
    revision before while it is pending; a later revision follows revision 1."""
    original = completed(ledger)
    pending = ledger.request_revision(original.run_id, "one", params={"recipients": []}).run
    assert ledger.finished([original.run_id])[original.run_id].output == {"text": "first"}
    finish(ledger, ledger.get(pending.run_id), "second")
    found = ledger.finished([original.run_id])[original.run_id]
    assert (found.run_id, found.revision, found.output) == (pending.run_id, 1, {"text": "second"})
    assert found.params_fingerprint != original.params_fingerprint
    second = ledger.request_revision(original.run_id, "two").run
    assert (second.revision, second.revises_run_id, second.params) == (
        2, pending.run_id, {"recipients": []})
    assert [r.revision for r in ledger.revisions(second.run_id)] == [0, 1, 2]


def test_the_conflict_message_tells_the_revise_command(ledger: Ledger) -> None:
    """RunConflict names the true way out: bump the version or revise with new params."""
    original = completed(ledger)
    with pytest.raises(RunConflict, match=rf"runledger runs revise {original.run_id} "
                                          r"--reason '\.\.\.' --params"):
        ledger.register(identity(), {"recipients": ["new@example.com"]})


def test_migrating_an_existing_ledger_keeps_its_run_ids_and_makes_them_revisable(
        empty_db_url: str) -> None:
    """A Run written before migration 0007 is revision 0 under the id it had, can be revised
    after it; downgrading removes the revisions and keeps the original."""
    from alembic import command
    from alembic.config import Config

    from store.ledger import MIGRATIONS

    with Ledger.connect(empty_db_url) as ledger:
        ledger.migrate("0006")
        old = identity()
        with ledger.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO runs (run_id, job, subject, period_start, version, "
                "params_fingerprint, params, status, fence, attempts, raw_input, output, "
                "created_at, updated_at, completed_at) VALUES (:id, 'digest', 'team-a', :start, "
                "'v1', 'f', '{}', 'completed', 1, 1, '{}', '{}', :start, :start, :start)"),
                {"id": old.run_id, "start": PERIOD.replace(tzinfo=None)})
        ledger.migrate()
        run = ledger.get(old.run_id)
        assert (run.revision, run.revises_run_id) == (0, None)
        revision = ledger.request_revision(old.run_id, "after the upgrade").run
        assert revision.run_id == old.revised(1).run_id
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with ledger.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0006")
        assert row_count(ledger) == 1


def test_the_guarded_insert_alone_refuses_a_revision_after_an_unfinished_one(
        ledger: Ledger) -> None:
    """Without the caller's checks, the statement itself inserts revision 2 only once
    revision 1 is finished, and never revision 1 twice (the identity key)."""
    from store import revisions

    original = completed(ledger)
    first = ledger.request_revision(original.run_id, "one").run
    base = identity()

    def insert(number: int, follows: str) -> object:
        with ledger.engine.begin() as conn:
            return revisions._REQUEST_REVISION.first(
                conn, run_id=base.revised(number).run_id, source_run_id=original.run_id,
                revision=number, revises_run_id=follows, revision_reason="raw", resend=True,
                requested_by=None, params_fingerprint="f", params={}, recollect=False)

    assert insert(2, first.run_id) is None  # revision 1 is pending
    assert insert(1, original.run_id) is None  # revision 1 exists
    finish(ledger, ledger.get(first.run_id), "second")
    assert insert(2, first.run_id) is not None
    assert [r.revision for r in ledger.revisions(original.run_id)] == [0, 1, 2]


def test_a_pruned_run_is_revised_only_by_collecting_its_input_again(ledger: Ledger) -> None:
    """A tombstone holds no raw input: a revision that would reuse it is refused, naming
    --recollect, with nothing written; with recollect the revision is made."""
    run = ledger.register(identity(), PARAMS)
    claim = ledger.claim(run.run_id, "worker:1", LEASE)
    assert claim is not None
    ledger.save_input(claim, {"items": "a, b"})
    ledger.complete(claim, {"text": "first"}, [])
    ledger.retention.prune_batch(datetime.now(UTC) + timedelta(days=1), ["digest"])
    assert ledger.get(run.run_id).pruned_at is not None
    with pytest.raises(RevisionRefused, match=r"pruned.*--recollect"):
        ledger.request_revision(run.run_id, "model fixed", requested_by="req-1")
    assert row_count(ledger) == 1
    revision = ledger.request_revision(run.run_id, "model fixed", params=PARAMS,
                                       recollect=True, requested_by="req-1")
    assert revision.new and revision.run.raw_input is None and revision.run.params == PARAMS
