"""Drill 5, one large tick: N subjects of one job through the real ``run-job`` flow (offline
model) on a PostgreSQL ledger, against the drills' PostgreSQL-backed ``prefect server``
(tests/support/prefect_server.py), the flow run in a process of its own
(bench/volume_tick.py) whose peak RSS is read when it ends (wait4's ru_maxrss, and
/proc's VmHWM as it prints its report). Then a rerun of the completed tick, in another
process. Reduced here (200 subjects); RUNLEDGER_FULL=1 runs
1,000 and 10,000 subjects, and asserts the peak RSS ratio of the two at most 1.5.

Printed and asserted: the tick completes every subject; every ``runledger.run.*`` event the
flow emitted is on the server (counted through the events API, by name and page by page, the
same as the flow's own count); the rerun is ``Duplicate``: no model call, no new Run or
Attempt, no outbox row and no task run. Printed: wall and CPU time of both processes, the
time per subject and the peak RSS (never asserted as a time)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flows.registry import upgrade_ledger
from flows.run_job.outcomes import EVENT_BACKLOG_LIMIT
from flows.settings import RunledgerSettings
from store import Ledger
from store.call_tables import model_calls_table
from tests.support.prefect_server import Server

FULL = os.environ.get("RUNLEDGER_FULL") == "1"
SIZES = tuple(int(n) for n in os.environ.get(
    "RUNLEDGER_DRILL_SIZES", "1000,10000" if FULL else "200").split(","))
RSS_RATIO_TARGET = 1.5
ROOT = Path(__file__).resolve().parents[2]
EVENT_PREFIX = "runledger.run."
PERIOD = "2026-03-02"
DEADLINE_SECONDS = 300 + sum(SIZES) // 2  # a busy server records events slowly


@dataclass(frozen=True)
class Tick:
    """What one flow-run process did and cost."""

    report: dict[str, Any]
    seconds: float
    cpu_seconds: float
    max_rss_kib: int


def run_tick(env: dict[str, str], job: str, size: int, log: Path) -> Tick:
    """The tick in a process of its own; its wall time, CPU time and peak RSS."""
    started = time.monotonic()
    with log.open("ab") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.volume_tick", job, str(size), PERIOD],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
        assert process.stdout is not None
        with process.stdout:
            out = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    assert process.returncode == 0, log.read_text()[-5000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    return Tick(report, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)


def occurred(since: datetime) -> dict[str, str]:
    return {"since": since.isoformat(), "until": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}


def event_filter(job: str, since: datetime) -> dict[str, Any]:
    return {"occurred": occurred(since), "event": {"prefix": [EVENT_PREFIX]},
            "resource": {"labels": {"runledger.job": [job]}}}


def counted_events(api: str, job: str, since: datetime) -> Counter[str]:
    """The job's runledger.run.* events on the server, by name (the count endpoint)."""
    response = httpx.post(f"{api}/events/count-by/event",
                          json={"filter": event_filter(job, since)}, timeout=60)
    response.raise_for_status()
    return Counter({row["value"]: row["count"] for row in response.json()})


def paged_events(api: str, job: str, since: datetime) -> tuple[int, Counter[str]]:
    """The same events read page by page: the total the server reports, and the distinct
    event ids seen by name."""
    seen: dict[str, str] = {}
    with httpx.Client(timeout=60) as http:
        page = http.post(f"{api}/events/filter",
                         json={"filter": event_filter(job, since), "limit": 50}).json()
        total = page["total"]
        while True:
            seen.update((e["id"], e["event"]) for e in page["events"])
            if not page["next_page"]:
                break
            page = http.get(page["next_page"]).json()
    return total, Counter(seen.values())


def wait_for_events(api: str, job: str, since: datetime, expected: Counter[str],
                    quiet_seconds: float = 60 + max(SIZES) / 20) -> Counter[str]:
    """Until the server counts ``expected``, or its count has not grown for
    ``quiet_seconds`` (the events it dropped never arrive; a server storing a 10,000-subject
    tick's events can go minutes without storing one of the next tick's); the last count."""
    last, changed = Counter[str](), time.monotonic()
    while True:
        found = counted_events(api, job, since)
        if found == expected:
            return found
        if found != last:
            last, changed = found, time.monotonic()
        if time.monotonic() - changed > quiet_seconds:
            return found
        time.sleep(1)


def task_runs(api: str, flow_run_id: str) -> int:
    response = httpx.post(f"{api}/task_runs/count",
                          json={"flow_runs": {"id": {"any_": [flow_run_id]}}}, timeout=60)
    response.raise_for_status()
    return int(response.json())


def task_run_events(api: str, flow_run_id: str, since: datetime) -> Counter[str]:
    """The state events of the flow run's task runs on the server, by state (the server
    records task runs from these events, in the background and well behind them)."""
    response = httpx.post(f"{api}/events/count-by/event", json={"filter": {
        "occurred": occurred(since),
        "event": {"prefix": ["prefect.task-run."]},
        "related": {"id": [f"prefect.flow-run.{flow_run_id}"]}}}, timeout=60)
    response.raise_for_status()
    return Counter({row["value"].removeprefix("prefect.task-run."): row["count"]
                    for row in response.json()})


def wait_for_task_run_events(api: str, flow_run_id: str, since: datetime, expected: int,
                             quiet_seconds: float = 60) -> Counter[str]:
    """Until the server holds the Completed events of the flow run's ``expected`` task runs,
    or has held no more for ``quiet_seconds``; the last count by state."""
    last, changed = Counter[str](), time.monotonic()
    while (found := task_run_events(api, flow_run_id, since))["Completed"] < expected:
        if found != last:
            last, changed = found, time.monotonic()
        if time.monotonic() - changed > quiet_seconds:
            break
        time.sleep(1)
    return found


def ledger_rows(ledger: Ledger, job: str) -> dict[str, int]:
    """The job's Runs (and completed ones), Attempts and outbox rows in the ledger."""
    with ledger.engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT (SELECT count(*) FROM runs WHERE job = :job),"
            " (SELECT count(*) FROM runs WHERE job = :job AND status = 'completed'),"
            " (SELECT count(*) FROM attempts a JOIN runs r ON r.run_id = a.run_id"
            "  WHERE r.job = :job),"
            " (SELECT count(*) FROM outbox o JOIN runs r ON r.run_id = o.run_id"
            "  WHERE r.job = :job)"), {"job": job}).one()
    return dict(zip(("runs", "completed", "attempts", "outbox"), row, strict=True))


def calls_of(ledger: Ledger, job: str) -> int:
    """The model calls the ledger recorded for ``job`` (every one that left the worker)."""
    with ledger.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(model_calls_table)
                                .where(model_calls_table.c.job == job)).scalar_one())


def drill(size: int, server: Server, ledger_url: str, home: Path) -> dict[str, Any]:
    """One tick of ``size`` subjects and its rerun, asserted; the figures."""
    job = f"drill-volume-{size}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RUNLEDGER_", "PREFECT_"))},
           "PREFECT_API_URL": server.api, "PREFECT_HOME": str(home / "prefect-client"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
           "RUNLEDGER_DATABASE_URL": ledger_url, "RUNLEDGER_MODEL": "offline",
           "PYTHONPATH": str(ROOT)}
    since = datetime.now(UTC) - timedelta(minutes=1)
    first = run_tick(env, job, size, home / f"tick-{size}.log")
    # Printed at once: the server may take many minutes more to store the tick's events.
    print(f"\n{size} subjects: tick {first.seconds:.1f} s, CPU {first.cpu_seconds:.1f} s, peak "
          f"RSS {first.max_rss_kib / 1024:.0f} MiB, at most {first.report['most_unsent_events']} "
          f"events unsent at once; {first.report}", flush=True)
    assert first.report["state"] == "Completed", first.report
    assert first.report["outcomes"] == {"new": size}, first.report
    with Ledger.connect(ledger_url) as ledger:
        after_first = ledger_rows(ledger, job)
        assert after_first == {"runs": size, "completed": size, "attempts": size,
                               "outbox": size}, after_first
        calls = calls_of(ledger, job)
        assert calls == size
        emitted = Counter({"runledger.run.completed": first.report["run_events"]})
        on_server = wait_for_events(server.api, job, since, emitted)
        # register+claim per batch, then collect, transform and persist per subject.
        task_run_count = 3 * size + math.ceil(size / RunledgerSettings().claim_batch)
        stage_events = wait_for_task_run_events(server.api, first.report["flow_run_id"], since,
                                                task_run_count)

        rerun = run_tick(env, job, size, home / f"rerun-{size}.log")
        assert rerun.report["state"] == "Duplicate", rerun.report
        assert rerun.report["outcomes"] == {"duplicate": size}, rerun.report
        assert ledger_rows(ledger, job) == after_first
        assert calls_of(ledger, job) == calls  # no model call
    emitted["runledger.run.duplicate"] = rerun.report["run_events"]
    on_server = wait_for_events(server.api, job, since, emitted)
    # Read once its own events reached the server: a task run it started would have sent
    # its state events before them.
    rerun_stage_events = task_run_events(server.api, rerun.report["flow_run_id"], since)
    assert not rerun_stage_events, rerun_stage_events
    recorded = task_runs(server.api, first.report["flow_run_id"])
    total, paged = paged_events(server.api, job, since)
    figures = {
        "size": size, "seconds": first.seconds, "cpu_seconds": first.cpu_seconds,
        "max_rss_kib": first.max_rss_kib, "vm_hwm_kib": first.report["vm_hwm_kib"],
        "task_run_events": dict(stage_events), "task_runs_recorded": recorded,
        "most_unsent_events": first.report["most_unsent_events"],
        "rerun_seconds": rerun.seconds, "rerun_cpu_seconds": rerun.cpu_seconds,
        "rerun_max_rss_kib": rerun.max_rss_kib, "emitted": dict(emitted),
        "on_server": dict(on_server), "paged": dict(paged), "paged_total": total,
    }
    dropped = server.log.read_text(errors="replace").count("queue is full, dropping message")
    figures["server_dropped"] = dropped
    print(f"\n{size} subjects, server messaging {server.messaging} ({dropped} messages the "
          f"server logged dropped): tick {first.seconds:.1f} s ({1000 * first.seconds / size:.1f} ms "
          f"per subject), CPU {first.cpu_seconds:.1f} s, peak RSS {first.max_rss_kib / 1024:.0f} "
          f"MiB (VmHWM {first.report['vm_hwm_kib'] / 1024:.0f} MiB), at most "
          f"{first.report['most_unsent_events']} events unsent at once, task-run state events "
          f"{dict(stage_events)} ({recorded} task runs recorded by then); rerun {rerun.seconds:.1f} s, CPU {rerun.cpu_seconds:.1f} s, peak RSS "
          f"{rerun.max_rss_kib / 1024:.0f} MiB, 0 model calls, 0 task runs, no new Run, Attempt "
          f"or outbox row; runledger.run.* events emitted {dict(emitted)}, on the server "
          f"{dict(on_server)} (paged: {total} total, {dict(paged)} distinct ids)", flush=True)
    assert on_server == emitted, (on_server, emitted, server.log)
    assert paged == emitted and total == sum(emitted.values())
    # The tick held its subjects back while the server was behind (flows.run_job.outcomes.EventBacklog).
    assert first.report["most_unsent_events"] <= EVENT_BACKLOG_LIMIT + 10 * (
        RunledgerSettings().subject_concurrency + 1), first.report
    assert stage_events == {state: task_run_count for state in ("Pending", "Running",
                                                                "Completed")}, stage_events
    return figures


def test_one_large_tick_completes_with_every_event_on_the_server_and_reruns_as_duplicate(
        drill_server: Server, postgres_databases: Any, tmp_path: Path) -> None:
    """A tick of N subjects on a PostgreSQL ledger completes every Run, the server holds every
    runledger.run.* event it emitted, and its rerun is a Duplicate that calls no model, writes
    no Run and starts no task run; at full size, peak RSS grows at most 1.5 times from 1,000
    to 10,000 subjects."""
    ledger_url = postgres_databases.create()
    try:
        with Ledger.connect(ledger_url) as ledger:
            upgrade_ledger(ledger)
        rows = [drill(size, drill_server, ledger_url, tmp_path) for size in SIZES]
    finally:
        postgres_databases.drop(ledger_url)
    if len(rows) == 2:
        small, large = rows
        ratio = large["max_rss_kib"] / small["max_rss_kib"]
        per_subject = [r["seconds"] / r["size"] for r in rows]
        print(f"peak RSS ratio {large['size']}/{small['size']} subjects: {ratio:.2f} "
              f"(target <= {RSS_RATIO_TARGET}); time per subject {1000 * per_subject[0]:.1f} "
              f"ms and {1000 * per_subject[1]:.1f} ms", flush=True)
        assert ratio <= RSS_RATIO_TARGET, rows


pytestmark = [pytest.mark.drill, pytest.mark.postgres,
              pytest.mark.timeout(DEADLINE_SECONDS)]
