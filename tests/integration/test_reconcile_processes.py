"""Reconcile against real processes: two `runledger reconcile` passes at the same moment start
each missing Run once and report each overdue occurrence once, a worker SIGKILLed in the
middle of its model call has its Run finished once by reconcile after the lease expires, and a
pass SIGKILLed right after any decision's commit loses no event: the next pass emits it, once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

from flows.events import OCCURRENCE_EVENTS
from flows.jobs import Job, MissedRunPolicy
from flows.jobs.competitor_summary import job as competitor_summary
from flows.reconcile.flow import reconcile_jobs
from store import Ledger
from store.faults import (
    AFTER_GIVE_UP_COMMIT,
    AFTER_MARK_OVERDUE_COMMIT,
    AFTER_MARK_RECOVERED_COMMIT,
    AFTER_SKIP_COMMIT,
    ENV,
)
from tests.support import reconcile_probe
from tests.support.ledger import register_and_claim
from tests.support.pipeline import (
    SUMMARY,
    Env,
    Worker,
    lease_expired,
    pipeline_env,
    wait_until,
)

pytestmark = pytest.mark.processes


@pytest.fixture
def env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_api: str) -> Iterator[Env]:
    """A fresh ledger; subprocesses use the session's Prefect server."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    with pipeline_env(db_url, tmp_path, monkeypatch) as found:
        found.set(reconcile_backoff_seconds=0)
        yield found


def overdue_events(run_ids: list[str]) -> int:
    with get_client(sync_client=True) as client:
        return len(client.read_events(EventFilter(
            event=EventNameFilter(name=["runledger.run.overdue"]),
            resource=EventResourceFilter(id=[f"runledger.run.{r}" for r in run_ids]),
        ), limit=50).events)


def test_two_reconcile_processes_at_once_start_each_missing_run_once(env: Env) -> None:
    """Both passes see the same four missed days of two subjects; together they complete each
    Run once (one model call each) and report each occurrence overdue once."""
    name = f"reconcile-probe-{uuid.uuid4().hex[:8]}"
    env.monkeypatch.setenv(reconcile_probe.ENV, name)
    command = [sys.executable, "-c", reconcile_probe.LOAD, "reconcile", name, "--json"]
    passes = [subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=Path.cwd())
              for _ in range(2)]
    for running in passes:
        _, err = running.communicate(timeout=300)
        assert running.returncode in (0, 1), err[-2000:]
    runs = env.ledger.runs(job=name, limit=100)
    assert len(runs) == 8 and {r.status for r in runs} == {"completed"}
    calls = Counter(e["run_id"] for e in env.calls())
    assert set(calls.values()) == {1} and set(calls) == {r.run_id for r in runs}
    run_ids = [r.run_id for r in runs]
    wait_until(lambda: overdue_events(run_ids) >= 8, 30, "the overdue events")
    assert overdue_events(run_ids) == 8


def test_a_worker_killed_mid_transform_is_finished_once_by_reconcile(env: Env) -> None:
    """SIGKILL during acme's model call: once the lease expires, a reconcile pass (its first:
    acme is owed from its Run's period) re-drives the stranded Run, which completes once with
    the stored raw input."""
    env.set(offline_model_delay_seconds=60, lease_seconds=6)
    # The latest due day: before 07:00 in Paris the period containing now is not due yet.
    period = competitor_summary.latest_due_period(env.ledger.now())
    worker = Worker.start([SUMMARY, "--subject", "acme", "--period", period.label])
    try:
        wait_until(lambda: any(e["pid"] == worker.pid for e in env.calls()),
                   90, "the worker's model call")
        worker.signal(signal.SIGKILL)
        worker.finish()
    finally:
        worker.kill()
    env.set(offline_model_delay_seconds=0, lease_seconds=900)
    run_id = competitor_summary.identity("acme", period).run_id
    wait_until(lambda: lease_expired(env.ledger, run_id), 30, "the dead worker's lease")
    [done] = asyncio.run(reconcile_jobs([competitor_summary]))
    [step] = [s for s in done.plan.steps if s.owed.identity.run_id == run_id]
    assert step.action == "redrive"
    assert env.ledger.get(run_id).status == "completed"
    acme_calls = [e for e in env.calls() if e["run_id"] == run_id]
    assert len(acme_calls) == 2  # the killed one, and the one that completed
    assert [a.outcome for a in env.ledger.attempts(run_id)] == ["expired", "completed"]


# Where a pass is killed, and the missed-run policy of its job (each point needs a decision).
KILLED_AT: dict[str, MissedRunPolicy] = {
    AFTER_SKIP_COMMIT: "skip", AFTER_GIVE_UP_COMMIT: "catch-up",
    AFTER_MARK_OVERDUE_COMMIT: "catch-up", AFTER_MARK_RECOVERED_COMMIT: "catch-up"}


def decisions(ledger: Ledger, job: Job) -> Counter[tuple[str, str]]:
    """One (event, resource id) per decision the ledger holds about the job's occurrences."""
    made: Counter[tuple[str, str]] = Counter()
    for o in ledger.occurrences.list(job.name, ledger.now() - timedelta(days=30)):
        for kind, at in (("skipped", o.skipped_at), ("overdue", o.overdue_at),
                         ("recovered", o.recovered_at)):
            if at is not None:
                made[OCCURRENCE_EVENTS[kind], f"runledger.run.{o.run_id}"] += 1
    for run in ledger.runs(job=job.name, status="failed"):
        if (run.error or "").startswith("gave up"):
            made[OCCURRENCE_EVENTS["gave-up"], f"runledger.run.{run.run_id}"] += 1
    return made


def decision_events(job: Job, resources: list[str]) -> Counter[tuple[str, str]]:
    """The (event, resource id) of every decision event the Prefect server holds for these."""
    held: Counter[tuple[str, str]] = Counter()
    with get_client(sync_client=True) as client:
        for name in OCCURRENCE_EVENTS.values():
            page = client.read_events(EventFilter(
                event=EventNameFilter(name=[name]), resource=EventResourceFilter(id=resources),
            ), limit=50)
            held.update((e.event, e.resource.id) for e in page.events)
    return held


def strand_past_its_cap(ledger: Ledger, job: Job) -> None:
    """acme's Run of two days ago: released by dead workers as many times as the job allows."""
    period = job.period_at(ledger.now() - timedelta(days=2))
    for attempt in range(job.max_attempts):
        claim = register_and_claim(ledger, job.identity("acme", period),
                                   job.run_params("acme", period),
                                   owner=f"dead:{attempt}", lease=60).claim
        assert claim is not None
        ledger.fail(claim, "TimeoutError: model", retryable=True)


def test_a_pass_killed_after_any_decisions_commit_leaves_its_event_to_the_next_pass_once(
        env: Env) -> None:
    """A `runledger reconcile` process SIGKILLed right after committing skips, a give-up,
    overdue reports or recoveries (one job each, all at once); the next pass emits every
    decision's event: the Prefect server holds exactly one per decision."""
    jobs = {point: reconcile_probe.probe(f"killed-{uuid.uuid4().hex[:8]}", policy)
            for point, policy in KILLED_AT.items()}
    strand_past_its_cap(env.ledger, jobs[AFTER_GIVE_UP_COMMIT])
    killed = {}
    for point, job in jobs.items():
        command = [sys.executable, "-c", reconcile_probe.LOAD, "reconcile", job.name]
        killed[point] = subprocess.Popen(command, env={
            **os.environ, ENV: point, reconcile_probe.ENV: job.name,
            reconcile_probe.POLICY: job.missed_runs}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, cwd=Path.cwd())
    for point, running in killed.items():
        _, err = running.communicate(timeout=300)
        assert running.returncode == -signal.SIGKILL, (point, err[-2000:])
    asyncio.run(reconcile_jobs(list(jobs.values())))
    expected = {point: decisions(env.ledger, job) for point, job in jobs.items()}
    for point, kind in ((AFTER_SKIP_COMMIT, "skipped"), (AFTER_GIVE_UP_COMMIT, "gave-up"),
                        (AFTER_MARK_OVERDUE_COMMIT, "overdue"),
                        (AFTER_MARK_RECOVERED_COMMIT, "recovered")):
        assert any(name == OCCURRENCE_EVENTS[kind] for name, _ in expected[point]), point

    def held() -> dict[str, Counter[tuple[str, str]]]:
        return {point: decision_events(job, sorted({r for _, r in expected[point]}))
                for point, job in jobs.items()}

    wait_until(lambda: held() == expected, 60, "one event per decision")
    assert held() == expected
