"""Retention that keeps deduplication, on SQLite and PostgreSQL: a seeded ledger of many Runs
(10,000 in the suite, 100,000 with RUNLEDGER_FULL=1) is pruned in bounded batches while
another writer keeps completing Runs; a pruned period rerun through the real pipeline is a
Duplicate that calls no model; a dry run and a refused retention change nothing; a Run with a
message still to deliver, a failed and a pending Run are never touched."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import Result

from bench.seeding import DEAD_EVERY, UNSENT_EVERY, old, seed
from flows.retention import prune_ledger
from flows.run_job.outcomes import outcome_name
from store import Ledger, OutputPruned, Reply
from tests.support.pipeline import Env, probe_job, wait_until
from tests.support.retention import Writer, checksum, tombstone_bytes

FULL = os.environ.get("RUNLEDGER_FULL") == "1"
RUNS = 100_000 if FULL else 10_000
RETENTION = timedelta(days=90)


def deliver_all(ledger: Ledger) -> None:
    """Mark every due message sent, as a dispatcher that got 250 for each would."""
    while claims := ledger.outbox.claim_messages("test-dispatcher", 100, 30):
        ledger.outbox.mark_sent([(c, Reply(250, "ok")) for c in claims])


def run_count(ledger: Ledger) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM runs")).scalar_one())


def test_a_pruned_period_rerun_through_the_pipeline_is_a_duplicate_that_calls_no_model(
        env: Env) -> None:
    """After its Run is pruned to a tombstone (its model calls keep their record, not their
    answers), the same period run again ends Duplicate: no collect, no model call, no new Run
    row; its state message says the output was pruned (date and digest), and a caller that
    needs the output gets OutputPruned."""
    probe = probe_job(["acme", "globex"])
    state, _ = env.run(probe.name, period="2026-11-20")
    assert state.name == "Completed" and env.model_calls() == 2
    deliver_all(env.ledger)
    report = prune_ledger(env.ledger, RETENTION, [probe.job],
                          now=env.ledger.now() + timedelta(days=200))
    assert report.total("runs") == 2 and report.total("outbox") == 4
    run = env.the_run("acme", "2026-11-20", probe.job)
    assert run.status == "completed" and run.output is None and run.pruned_at is not None
    calls = env.calls()
    assert [(c["outcome"], c["answer"], c["pid"]) for c in calls] == [("answered", None, None)] * 2
    rows, collects = run_count(env.ledger), list(probe.collects)

    state, again = env.run(probe.name, period="2026-11-20")

    assert outcome_name(state) == "Duplicate", state
    assert env.model_calls() == 2 and probe.collects == collects
    assert run_count(env.ledger) == rows
    message = state.message or ""
    assert "output pruned" in message and run.output_digest is not None
    assert run.output_digest in message
    assert run.pruned_at.date().isoformat() in message
    acme = next(s for s in again.subjects if s.subject == "acme")  # type: ignore[union-attr]
    with pytest.raises(OutputPruned, match="nothing was recomputed"):
        acme.require_output()


def test_pruning_a_large_ledger_keeps_every_tombstone_and_other_writers_keep_working(
        db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A seeded ledger is pruned in batches of 1,000 while a writer thread registers, claims
    and completes Runs: the writer completes a cycle between every two batches and never
    fails; every completed Run without a message to deliver becomes a tombstone (status,
    identity, fingerprint, digest kept; documents, attempts, outbox rows and delivery attempts
    gone); failed, pending and undelivered Runs are untouched."""
    probe = probe_job()
    with Ledger.connect(db_url) as ledger:
        started = time.perf_counter()
        seeded = seed(ledger, probe.name, RUNS, old(ledger))
        seeded_in = time.perf_counter() - started
        writer = Writer(db_url)
        thread = threading.Thread(target=writer.run)
        thread.start()
        cycles: list[int] = []
        try:
            writer.one_more()
            before = writer.cycles

            def between_batches(done: int, total: int) -> None:
                writer.one_more()
                cycles.append(writer.cycles)

            started = time.perf_counter()
            report = prune_ledger(ledger, RETENTION, [probe.job], batch_size=1000,
                                  progress=between_batches)
            pruned_in = time.perf_counter() - started
        finally:
            writer.stop.set()
            thread.join(60)
        assert writer.errors == []
        pruned = seeded.completed - seeded.unsent
        assert report.total("batches") == len(cycles) and cycles[0] > before
        assert len(cycles) >= -(-RUNS // 1000)  # windows of 1,000 over every Run
        assert cycles == sorted(set(cycles))  # the writer moved on between every batch
        assert report.total("runs") == pruned
        assert report.total("attempts") == pruned and report.total("outbox") == pruned
        assert report.total("skipped_unfinished_outbox") == seeded.unsent
        assert report.total("skipped_failed") == seeded.failed
        assert report.total("skipped_unfinished") == seeded.pending
        with ledger.engine.connect() as conn:
            by_state: dict[str, int] = dict(conn.execute(sa.text(
                "SELECT CASE WHEN pruned_at IS NULL THEN 'kept' ELSE 'tombstone' END, "
                "count(*) FROM runs WHERE job = :job GROUP BY 1"), {"job": probe.name}).all())
            broken = conn.execute(sa.text(
                "SELECT count(*) FROM runs WHERE pruned_at IS NOT NULL AND (status <> "
                "'completed' OR output IS NOT NULL OR raw_input IS NOT NULL OR params IS NOT "
                "NULL OR output_digest IS NULL OR params_fingerprint IS NULL OR "
                "completed_at IS NULL)")).scalar_one()
            orphans = conn.execute(sa.text(
                "SELECT (SELECT count(*) FROM attempts a JOIN runs r USING (run_id) WHERE "
                "r.pruned_at IS NOT NULL) + (SELECT count(*) FROM outbox o JOIN runs r "
                "USING (run_id) WHERE r.pruned_at IS NOT NULL)")).scalar_one()
            kept = conn.execute(sa.text(
                "SELECT count(*) FROM runs r JOIN attempts a USING (run_id) WHERE "
                "r.pruned_at IS NULL AND r.raw_input IS NOT NULL AND r.job = :job"),
                {"job": probe.name}).scalar_one()
        assert by_state == {"tombstone": pruned, "kept": RUNS - pruned}
        assert broken == 0 and orphans == 0 and kept == RUNS - pruned
        row, per_run = tombstone_bytes(ledger)
        with capsys.disabled():
            print(f"\n{ledger.dialect}: {RUNS:,} Runs seeded in {seeded_in:.1f} s; "
                  f"{pruned:,} pruned in {pruned_in:.1f} s ({pruned / pruned_in:,.0f} "
                  f"Runs/s, {report.total('batches')} batches); writer cycles during the prune "
                  f"{cycles[-1] - before}; bytes reclaimed {report.reclaimed_bytes:,} "
                  f"(ledger {report.before.total_bytes:,} -> "
                  f"{report.after.total_bytes if report.after else 0:,}); tombstone row "
                  f"{row:.0f} bytes, runs table + indexes {per_run:.0f} bytes per Run")


def test_a_dry_run_changes_nothing_and_counts_what_the_pass_then_prunes(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """`prune --dry-run --json` leaves every ledger table as it was (row counts and a checksum
    of every row) and reports exactly what the real pass then removes, also as --json."""
    probe = probe_job()
    seeded = seed(ledger, probe.name, 1000, old(ledger))
    before = checksum(ledger)
    shown = invoke("prune", "--older-than", "90d", "--job", probe.name, "--dry-run", "--json")
    assert shown.exit_code == 0 and checksum(ledger) == before
    dry = json.loads(shown.stdout)
    assert dry["dry_run"] is True and dry["bytes_reclaimed"] is None
    assert dry["totals"]["runs"] == seeded.completed - seeded.unsent

    shown = invoke("prune", "--older-than", "90d", "--job", probe.name,
                   "--json", "--batch-size", "300")
    done = json.loads(shown.stdout)
    assert shown.exit_code == 0 and done["dry_run"] is False
    for name in ("runs", "attempts", "outbox", "delivery_attempts"):
        assert done["totals"][name] == dry["totals"][name], name
    assert done["totals"]["batches"] == -(-run_count(ledger) // 300)  # windows of 300 Runs
    assert done["bytes_reclaimed"] > 0
    shown = invoke("prune", "--older-than", "90d", "--job", probe.name)
    assert shown.exit_code == 0 and "Runs pruned" in shown.stdout


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--older-than", "3d"], {}, "catch_up_window"),
    (["--older-than", "30d"], {"RUNLEDGER_DELIVERY_MAX_WINDOW_HOURS": "1000"},
     "RUNLEDGER_DELIVERY_MAX_WINDOW_HOURS"),
    (["--older-than", "30d"], {"RUNLEDGER_DELIVERY_TRANSPORT": "provider",
                               "RUNLEDGER_PROVIDER_API_KEY": "k",
                               "RUNLEDGER_MAIL_FROM": "jobs@example.com",
                               "RUNLEDGER_PROVIDER_KEY_RETENTION_HOURS": "1000"},
     "RUNLEDGER_PROVIDER_KEY_RETENTION_HOURS"),
    (["--older-than", "30 days"], {}, "whole days, hours or minutes"),
    (["--older-than", "0d"], {}, "longer than 0"),
    (["--older-than", "90d", "--batch-size", "20000"], {}, "--batch-size"),
], ids=["reconcile-window", "retry-window", "key-retention", "grammar", "zero", "batch"])
def test_a_refused_retention_names_its_setting_and_writes_nothing(
        invoke: Callable[..., Result], ledger: Ledger, monkeypatch: pytest.MonkeyPatch,
        args: list[str], env: dict[str, str], named: str) -> None:
    """A retention shorter than the job's reconcile window, the delivery retry window or the
    provider's key retention, a malformed DURATION or batch size: exit 1, one line naming the
    setting or the grammar, and every table unchanged."""
    probe = probe_job(catch_up_window=timedelta(days=7))
    seed(ledger, probe.name, 200, old(ledger))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = checksum(ledger)
    refused = invoke("prune", *args, "--job", probe.name)
    both = refused.stdout + refused.stderr
    assert refused.exit_code == 1 and named in " ".join(both.split()), both
    assert checksum(ledger) == before


def test_a_run_with_a_message_still_to_deliver_is_never_pruned_until_it_is_delivered(
        ledger: Ledger) -> None:
    """Each unfinished message status (pending, sending, retry, uncertain) keeps its whole Run
    (documents, attempts, outbox rows, delivery attempts); once delivered, the next pass
    prunes it."""
    probe = probe_job()
    seed(ledger, probe.name, UNSENT_EVERY * 4, old(ledger))
    unsent = [m for m in ledger.outbox.messages(limit=10_000)
              if m.status in ("pending", "sending", "retry", "uncertain")]
    assert sorted(m.status for m in unsent) == ["pending", "retry", "sending", "uncertain"]
    prune_ledger(ledger, RETENTION, [probe.job])
    for message in unsent:
        run = ledger.get(message.run_id)
        assert run.pruned_at is None and run.output is not None and run.raw_input is not None
        assert ledger.attempts(run.run_id) and ledger.outbox.message(message.message_id) == message
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET status = 'sent' WHERE run_id = :r"),
                     {"r": unsent[0].run_id})
    assert prune_ledger(ledger, RETENTION, [probe.job]).total("runs") == 1
    assert ledger.get(unsent[0].run_id).pruned_at is not None
    assert ledger.outbox.message(unsent[0].message_id) is None


def test_the_prune_flow_prunes_and_publishes_its_summary_as_an_artifact(env: Env) -> None:
    """The `prune` deployment's flow refuses nothing at its defaults, prunes the job's old
    Runs and leaves a markdown artifact (runledger-prune) with the summary."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.retention import ARTIFACT_KEY, prune

    probe = probe_job()
    seeded = seed(env.ledger, probe.name, 300, old(env.ledger))
    done = asyncio.run(prune(job=probe.name, batch_size=100))
    assert done["totals"]["runs"] == seeded.completed - seeded.unsent
    assert done["totals"]["batches"] == 3  # windows of 100 over the 300 Runs
    with get_client(sync_client=True) as client:
        [artifact, *_] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[ARTIFACT_KEY])))
    assert isinstance(artifact.data, str) and "Runs pruned" in artifact.data


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_dead_message_requeued_while_a_batch_picks_its_run_keeps_the_run_whole(
        ledger: Ledger, db_url: str, postgres_databases: Any) -> None:
    """PostgreSQL: an operator's requeue of a dead message, uncommitted while a batch picks
    its Run, makes the batch wait for the outbox row, read its new status and leave that Run
    out, documents, attempts and message intact; the other Runs of the batch are pruned."""
    probe = probe_job()
    seed(ledger, probe.name, DEAD_EVERY, old(ledger))
    [dead] = [m for m in ledger.outbox.messages(limit=1000) if m.status == "dead"]
    requeue = postgres_databases.hold(
        db_url, f"UPDATE outbox SET status = 'pending' WHERE message_id = '{dead.message_id}'")
    try:
        cutoff = ledger.now() - RETENTION
        pruning = ThreadPoolExecutor(1).submit(ledger.retention.prune_batch, cutoff, [probe.name],
                                               limit=1000)
        # The batch waits on the requeued row's lock; pg_stat_activity lists the whole server's
        # sessions, so only this test's database counts (other tests lock their own outboxes).
        # Each look in a transaction of its own: a transaction keeps its first view of it.
        def batch_waits() -> bool:
            with ledger.engine.connect() as conn:
                return bool(conn.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE '%FROM outbox%FOR UPDATE%'")
                ).scalar_one() == 1)

        wait_until(batch_waits, 60, "the batch to wait for the outbox row")
        requeue.commit()
        done = pruning.result(60)
    finally:
        requeue.close()
    assert done.runs == DEAD_EVERY - 1  # every seeded Run but the requeued one's
    run = ledger.get(dead.run_id)
    assert run.pruned_at is None and run.output is not None and ledger.attempts(run.run_id)
    message = ledger.outbox.message(dead.message_id)
    assert message is not None and message.status == "pending"
    assert ledger.outbox.delivery_attempts(dead.message_id)
