"""Reconcile against real processes: two `runledger reconcile` passes at the same moment start
each missing Run once and report each overdue occurrence once, and a worker SIGKILLed in the
middle of its model call has its Run finished once by reconcile after the lease expires."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

from flows.jobs.competitor_summary import job as competitor_summary
from flows.model import CallLog
from flows.reconcile.flow import reconcile_jobs
from tests.integration import reconcile_support
from tests.integration.pipeline_support import (
    SUMMARY,
    Env,
    Worker,
    lease_expired,
    pipeline_env,
    wait_until,
)


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
    env.monkeypatch.setenv(reconcile_support.ENV, name)
    command = [sys.executable, "-c", reconcile_support.LOAD, "reconcile", name, "--json"]
    passes = [subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=Path.cwd())
              for _ in range(2)]
    for running in passes:
        _, err = running.communicate(timeout=300)
        assert running.returncode in (0, 1), err[-2000:]
    runs = env.ledger.runs(job=name, limit=100)
    assert len(runs) == 8 and {r.status for r in runs} == {"completed"}
    calls = Counter(e["run_id"] for e in CallLog(env.calls).entries())
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
        wait_until(lambda: any(e["pid"] == worker.pid for e in CallLog(env.calls).entries()),
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
    acme_calls = [e for e in CallLog(env.calls).entries() if e["run_id"] == run_id]
    assert len(acme_calls) == 2  # the killed one, and the one that completed
    assert [a.outcome for a in env.ledger.attempts(run_id)] == ["expired", "completed"]
