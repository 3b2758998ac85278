"""Drill 3, PostgreSQL restarted while ticks and deliveries are in flight, on a private cluster
(never the shared server): `runledger run` workers tick the reference job (offline model) for
their periods while two dispatchers deliver, and the cluster is stopped (``fast`` or
``immediate``, alternately) and started again R times. A worker whose tick did not finish every
subject runs it again, as the next scheduled tick would; a dispatcher's next pass follows a
failed one, as the next deliver-outbox run would. Each restart waits for a Run leased by a tick,
so that it falls in the middle of one. Reduced here (2 workers, 8 Runs, 3 restarts);
RUNLEDGER_FULL=1 runs 4 workers, 200 Runs and 10 restarts.

Printed and asserted: Runs completed = expected, duplicate completions 0, no Run failed, every
outbox message sent with one unique Message-ID each at the sink, every error a tick or a pass
met transient (a retryable ledger error), and every run-job flow run ended in a documented
state."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter
from prefect.client.schemas.filters import FlowRunFilterExpectedStartTime as ExpectedStart

from flows.delivery.policy import RetryPolicy
from flows.errors import is_transient
from flows.jobs.competitor_summary import job as competitor_summary
from flows.jobs.competitor_summary import subscribers
from flows.mail.letter import message_id_for
from flows.mail.sink import Sink
from flows.registry import upgrade_ledger
from flows.run_job.outcomes import TickReport
from store import Ledger, RunledgerError
from tests.support.drill_periods import due_labels
from tests.support.fault_walk import delivery_pass
from tests.support.pipeline import RUNLEDGER, copy_sample_data, pipeline_env
from tests.support.private_postgres import PrivateCluster, binaries

FULL = os.environ.get("RUNLEDGER_FULL") == "1"
WORKERS = 4 if FULL else 2


def runs_of(full: bool) -> int:
    """The Runs drill 3 asks for at either size."""
    return 200 if full else 8


def drill_periods(full: bool, now: datetime) -> list[str]:
    """Drill 3's days, all due at ``now``: one per two Runs, ending with the latest due one."""
    return due_labels(competitor_summary, runs_of(full) // 2, now)


RUNS = runs_of(FULL)
RESTARTS = 10 if FULL else 3
DISPATCHERS = 2
JOB = competitor_summary.name
DOWN_SECONDS = (0.2, 1.5)  # how long each outage lasts (seeded draw)
POLICY = RetryPolicy(max_attempts=8, base_delay=0.05, max_delay=0.5, max_window=3600)
# The states docs/concepts/states.md lists for a tick's flow run (Crashed needs the automation):
# Prefect's own names, which the UI's default filters list.
DOCUMENTED = {"Completed", "Cached", "Cancelled", "Failed"}
DEADLINE_SECONDS = 1800 if FULL else 240
REQUIRE_POSTGRES = os.environ.get("RUNLEDGER_REQUIRE_POSTGRES") == "1"
PAGE = 200


def _retryable(kind: type[RunledgerError]) -> set[str]:
    """The names of ``kind`` and its subclasses whose errors say they are retryable."""
    names = {kind.__name__} if kind.retryable else set()
    return names.union(*(_retryable(k) for k in kind.__subclasses__()))


# A subject's error is "Type: message"; `runledger run` prints a ledger error it met before the
# tick as "error: message", and LedgerUnavailable's messages say one of these.
RETRYABLE = _retryable(RunledgerError)
UNAVAILABLE = ("error: the ledger database dropped the connection",
               "error: the ledger database failed the statement")


def transient(text: str) -> bool:
    return text.split(":")[0] in RETRYABLE or text.startswith(UNAVAILABLE)


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    """A private PostgreSQL cluster, stopped and removed at the end (even on failure)."""
    found = binaries()
    if found is None:
        message = "initdb and pg_ctl not found under /usr/lib/postgresql/*/bin"
        if REQUIRE_POSTGRES:
            pytest.fail(message + " (RUNLEDGER_REQUIRE_POSTGRES=1: this drill must run)")
        else:
            pytest.skip(message)
    private = PrivateCluster(found)
    try:
        yield private.start()
    finally:
        private.destroy()


@dataclass
class Tally:
    """What the workers and dispatchers met, shared between their threads."""

    ticks: Counter[str] = field(default_factory=Counter)  # tick outcome -> count
    errors: list[str] = field(default_factory=list)  # every error met, transient or not
    permanent: list[str] = field(default_factory=list)
    passes: Counter[str] = field(default_factory=Counter)  # "ok" / "failed"
    lock: threading.Lock = field(default_factory=threading.Lock)
    began: float = field(default_factory=time.monotonic)

    def error(self, text: str, transient: bool) -> None:
        with self.lock:
            self.errors.append(text)
            if not transient:
                self.permanent.append(text)


def tick_until_done(env: dict[str, str], period: str, tally: Tally, deadline: float,
                    stop: threading.Event) -> None:
    """`runledger run JOB --period P` until a tick finds every subject completed (or the
    drill stops)."""
    while not stop.is_set():
        assert time.monotonic() < deadline, f"period {period} never finished"
        done = subprocess.run([*RUNLEDGER, "run", JOB, "--period", period, "--json"], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else None
        if report is None:  # the command failed outside the tick: its one-line error, or all
            lines = done.stderr.strip().splitlines()
            error = next((line for line in lines if line.startswith("error:")), None)
            with tally.lock:
                tally.ticks["no tick"] += 1
            tally.error(error or "\n".join(lines[-40:]), error is not None and transient(error))
            continue
        outcomes = {s["outcome"] for s in report["subjects"]}
        with tally.lock:
            tally.ticks[report["state"]] += 1
        for s in report["subjects"]:
            if s["error"]:
                tally.error(s["error"], transient(s["error"]))
        if outcomes <= {"new", "duplicate"}:
            return


def worker(env: dict[str, str], periods: list[str], tally: Tally, deadline: float,
           stop: threading.Event) -> None:
    for period in periods:
        tick_until_done(env, period, tally, deadline, stop)


def dispatch(url: str, sink: Sink, stop: threading.Event, tally: Tally) -> None:
    """Delivery passes until ``stop``; a pass that fails is followed by the next one."""
    with Ledger.connect(url) as ledger:
        while not stop.is_set():
            try:
                delivery_pass(ledger, sink.host, sink.port, timeout=0.5, lease=4.0,
                              policy=POLICY, mark_batch=5, batch_size=10)
                with tally.lock:
                    tally.passes["ok"] += 1
            except RunledgerError as exc:
                with tally.lock:
                    tally.passes["failed"] += 1
                tally.error(f"delivery pass: {type(exc).__name__}: {exc}", is_transient(exc))
            time.sleep(0.1)


def wait_for_a_tick_in_flight(url: str, workers: list[threading.Thread], deadline: float) -> None:
    """Until a Run is leased by a tick (or every worker finished), so that each restart falls
    in the middle of one; the dispatchers pass every 0.1 s whatever happens."""
    with Ledger.connect(url) as ledger:
        while any(w.is_alive() for w in workers):
            assert time.monotonic() < deadline, "no tick started"
            try:
                if ledger.runs(job=JOB, status="running", limit=1):
                    return
            except RunledgerError as exc:  # just started: the server may still refuse
                assert exc.retryable, exc
            time.sleep(0.05)


def flow_runs(api_started: datetime) -> tuple[Counter[str], Counter[str]]:
    """The final state of every run-job flow run made since ``api_started``, and how many of
    their stage task runs ran more than once (a transient error retried), by stage."""
    made = FlowRunFilter(expected_start_time=ExpectedStart(after_=api_started))
    named = FlowFilter(name=FlowFilterName(any_=["run-job"]))

    async def read() -> tuple[list[Any], list[Any]]:
        runs: list[Any] = []
        tasks: list[Any] = []
        async with get_client() as client:
            # Page by page: the API answers at most its default limit (200) per call.
            for found, reader in ((runs, client.read_flow_runs), (tasks, client.read_task_runs)):
                while page := await reader(flow_filter=named, flow_run_filter=made,
                                           limit=PAGE, offset=len(found)):
                    found += page
        return runs, tasks
    runs, tasks = asyncio.run(read())
    return (Counter(run.state.name if run.state else "None" for run in runs),
            Counter(task.name.split("[")[0] for task in tasks if task.run_count > 1))


def test_postgresql_restarts_during_ticks_and_deliveries_lose_and_duplicate_nothing(
        cluster: PrivateCluster, prefect_api: str, tmp_path: Path) -> None:
    """After R restarts of the ledger's server mid-work, every Run is completed once, every
    message is sent once, every error met was transient, and the flow runs ended as documented."""
    periods = drill_periods(FULL, datetime.now(UTC))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNLEDGER_")},
           "RUNLEDGER_DATABASE_URL": cluster.url, "PREFECT_API_URL": prefect_api,
           "RUNLEDGER_COMPETITOR_SUMMARY_SOURCE": str(copy_sample_data(tmp_path / "source")),
           "RUNLEDGER_LEASE_SECONDS": "4", "RUNLEDGER_TASK_RETRIES": "6",
           "RUNLEDGER_RETRY_DELAY_SECONDS": "0.25",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with Ledger.connect(cluster.url) as ledger:
        upgrade_ledger(ledger)
    tally, stop, rng = Tally(), threading.Event(), random.Random(3)
    started = datetime.now().astimezone()
    deadline = time.monotonic() + DEADLINE_SECONDS
    with Sink() as sink:
        # Daemons, and told to stop at the end: a failed drill leaves no thread behind.
        workers = [threading.Thread(target=worker, daemon=True,
                                    args=(env, periods[i::WORKERS], tally, deadline, stop))
                   for i in range(WORKERS)]
        dispatchers = [threading.Thread(target=dispatch, args=(cluster.url, sink, stop, tally),
                                        daemon=True) for _ in range(DISPATCHERS)]
        for thread in [*workers, *dispatchers]:
            thread.start()
        try:
            for i in range(RESTARTS):
                wait_for_a_tick_in_flight(cluster.url, workers, deadline)
                cluster.stop("immediate" if i % 2 else "fast")
                time.sleep(rng.uniform(*DOWN_SECONDS))
                cluster.start()
            for thread in workers:
                thread.join(max(1.0, deadline - time.monotonic()))
            with Ledger.connect(cluster.url) as ledger:
                while not all(m.status == "sent" for m in ledger.outbox.messages(limit=RUNS * 10)):
                    assert time.monotonic() < deadline, ledger.outbox.message_counts()
                    time.sleep(0.2)
        finally:
            stop.set()
            for thread in dispatchers:
                thread.join(60)
        with Ledger.connect(cluster.url) as ledger:
            report(ledger, sink, tally, *flow_runs(started))


def refuse_then_start(cluster: PrivateCluster) -> threading.Thread:
    """While the stopped cluster's port is free, answer its first connection by closing it
    (a server going away), then start the cluster: the caller's first try surely failed."""
    listener = socket.create_server(("127.0.0.1", cluster.port))

    def serve() -> None:
        try:
            with listener:
                listener.settimeout(60)
                connection, _ = listener.accept()
                connection.close()
        finally:
            cluster.start()

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_a_tick_that_starts_while_the_server_is_away_completes_once_it_is_back(
        cluster: PrivateCluster, prefect_api: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick's first ledger read (its finished Runs) is retried on a transient error like
    its stages, so a tick started during an outage completes instead of failing its flow run
    (found by drill 3)."""
    with pipeline_env(cluster.url, tmp_path, monkeypatch) as env:
        env.set(retry_delay_seconds=0.5, task_retries=4)
        cluster.stop("fast")
        starting = refuse_then_start(cluster)
        try:
            state, report = env.run(JOB, period="2026-01-01")
        finally:
            starting.join(60)
        assert isinstance(report, TickReport), report
        assert report.completed_every_subject() and state.name == "Completed"


def report(ledger: Ledger, sink: Sink, tally: Tally, states: Counter[str],
           retried: Counter[str]) -> None:
    """Assert and print the drill's figures."""
    runs = ledger.runs(job=JOB, limit=RUNS + 1)
    completions = Counter(r.run_id for r in runs for a in ledger.attempts(r.run_id)
                          if a.outcome == "completed")
    expected_rows = sum(len(subscribers(r.subject)) for r in runs)
    messages = ledger.outbox.messages(limit=expected_rows + 1)
    copies = Counter(m.message_id for m in sink.messages)
    print(f"\n{RESTARTS} restarts in {time.monotonic() - tally.began:.0f} s; ticks by outcome {dict(tally.ticks)}; delivery passes "
          f"{dict(tally.passes)}; run-job flow runs by final state {dict(states)}; stage task "
          f"runs retried {dict(retried)}")
    print(f"Runs {len(runs)} of {RUNS}, completed {sum(r.status == 'completed' for r in runs)}, "
          f"duplicate completions {sum(n - 1 for n in completions.values())}; outbox rows "
          f"{len(messages)} (expected {expected_rows}), statuses {ledger.outbox.message_counts()}; sink "
          f"{sum(copies.values())} received, {len(copies)} unique Message-IDs")
    print(f"errors met: {len(tally.errors)}, permanent {len(tally.permanent)}")
    for text, n in Counter(e[:160] for e in tally.errors if e not in tally.permanent).items():
        print(f"  transient x{n}: {text}")
    for text in tally.permanent:
        print(f"  permanent: {text}")
    assert not tally.permanent
    assert len(runs) == RUNS and all(r.status == "completed" for r in runs)
    assert set(completions.values()) == {1} and len(completions) == RUNS
    assert len(messages) == expected_rows and all(m.status == "sent" for m in messages)
    assert set(copies) == {message_id_for(m.message_id) for m in messages}
    assert set(states) <= DOCUMENTED, states


pytestmark = [pytest.mark.drill, pytest.mark.postgres,
              pytest.mark.timeout(DEADLINE_SECONDS + 120)]
