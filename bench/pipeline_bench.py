"""run-job overhead against a bare Prefect flow doing the same stage work, in one run.

    uv run python bench/pipeline_bench.py [--sizes 100 1000] [--dialects sqlite postgres]
                                          [--model-delay 0] [--repeat 1]

Baseline: a bare flow shaped like ``run_job`` (an async flow whose sync body runs in a thread
with one Prefect client, the same fan-out) running the same job's collect, transform (offline
model) and validate + messages as Prefect tasks per subject, with no ledger. Candidate:
``run_job`` on a fresh ledger for a new period (one register+claim task run for the tick, then
collect, transform, persist per subject, plus the batched read, the lease keeper, artifact and
events). Then the rerun of that completed tick, which must call no model and start no task run.
Prints median wall times, their overhead ratio (target <= 1.15) and the ratio of this process's
CPU time (which leaves out the Prefect server's share when the server runs on the same machine);
with --repeat, also the median and range of each round's own ratio (both flows of a round run
back to back, so drift between rounds cancels out of it). Between measurements the server is
given time to record the task runs it was sent.

With --repeat 5 or more it also prints a bootstrap interval of that median and a verdict: the
target is met when the whole interval is at or below it, missed when the whole interval is above
it, and undecided otherwise (more rounds narrow the interval).

Prefect: with --server, a `prefect server start` of the script's own on a new PostgreSQL
database, dropped afterwards, run at a lower CPU priority (--server-nice), it and the PostgreSQL
backends serving its database, so that on a machine shared with it the server's background work
(recording task runs and events) does not take the flows' CPU, as when the server and its
database run on a host of their own; else PREFECT_API_URL if set; else a
temporary local server on SQLite. Logs at WARNING so that both flows pay the same small logging
cost. PostgreSQL ledgers are skipped when unreachable (RUNLEDGER_BENCH_POSTGRES_URL, default
postgresql+psycopg://postgres@127.0.0.1:5432/postgres)."""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from databases import postgres_database

TARGET = 1.15
PERIODS = iter(f"2026-{month:02d}-{day:02d}" for month in range(1, 13) for day in range(1, 29))


def _prefect_environment() -> None:
    # Prefect reads its settings when first imported: set them before any import of it.
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="runledger-bench-prefect-"))
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    # The temporary server's telemetry would phone home and take turns at its SQLite database
    # with the task runs being measured.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@contextmanager
def own_server(nice: int) -> Iterator[str]:
    """A PostgreSQL-backed ``prefect server start`` of this run's own, it and its database's
    backends at CPU priority ``nice``; yields its API URL and stops it (and drops its database)
    on exit."""
    from flows.stack import commands
    from flows.stack.prefect_server import api_url, server_env, wait_until_healthy
    from flows.stack.processes import Supervisor

    with postgres_database() as url, tempfile.TemporaryDirectory() as home:
        if url is None:
            raise SystemExit("--server needs PostgreSQL for the Prefect server's database")
        database = url.replace("postgresql+psycopg://", "postgresql+asyncpg://", 1)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        supervisor = Supervisor(Path(home) / "logs")
        try:
            server = supervisor.start(
                "prefect-server",
                ["nice", "-n", str(nice), *commands.server_argv("127.0.0.1", port, ui=False)],
                server_env(os.environ, Path(home) / "prefect", database),
            )
            api = api_url("127.0.0.1", port)
            wait_until_healthy(api, server, timeout=180)
            reniced = BackendsReniced(url, nice) if nice else None
            with reniced or nullcontext():
                yield api
            if reniced is not None:
                print(f"The server's database: {len(reniced.pids)} PostgreSQL backends kept at "
                      f"nice {nice}", flush=True)
                if reniced.error is not None:
                    print(f"WARNING: stopped renicing its new backends: {reniced.error!r}",
                          flush=True)
        finally:
            supervisor.stop()


class BackendsReniced:
    """Keeps the PostgreSQL backends serving a database at CPU priority ``nice``, checking for
    new ones every half second: the server's database work (several milliseconds of CPU per
    task run recorded) is the server's background work too, and a server on a host of its own
    would not take it from the flows."""

    def __init__(self, url: str, nice: int) -> None:
        import sqlalchemy as sa

        self.engine = sa.create_engine(url, pool_size=1)  # one connection, kept between checks
        self.nice = nice
        self.pids: set[int] = set()
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._keep, name="renice-backends", daemon=True)

    def __enter__(self) -> BackendsReniced:
        self._renice()  # fail here, not silently in the thread, when it cannot be done
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.engine.dispose()

    def _keep(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self._renice()
            except BaseException as exc:  # reported with the figures, which it may have skewed
                self.error = exc
                return

    def _renice(self) -> None:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            pids = conn.execute(sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")).scalars()
            for pid in set(pids) - self.pids:
                try:
                    os.setpriority(os.PRIO_PROCESS, pid, self.nice)
                except ProcessLookupError:  # the backend ended meanwhile
                    continue
                except PermissionError as exc:
                    raise SystemExit(f"--server-nice {self.nice}: cannot renice PostgreSQL "
                                     f"backend {pid} ({exc}); run as its owner or root, or "
                                     "pass --server-nice 0") from exc
                self.pids.add(pid)


def median_interval(ratios: list[float], confidence: float = 0.9,
                    resamples: int = 4000) -> tuple[float, float]:
    """A bootstrap ``confidence`` interval of the median of ``ratios`` (fixed seed: the same
    rounds always give the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    tail = (1 - confidence) / 2
    return medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]


def verdict(low: float, high: float) -> str:
    if high <= TARGET:
        return "target met"
    if low > TARGET:
        return "target missed"
    return "undecided"


@contextmanager
def ledger_url(dialect: str, directory: Path) -> Iterator[str | None]:
    """A fresh migrated ledger of ``dialect``; None when PostgreSQL is unreachable."""
    from store import Ledger

    if dialect == "sqlite":
        url = f"sqlite:///{directory / f'ledger-{uuid.uuid4().hex[:6]}.db'}"
        Ledger.connect(url).migrate()
        yield url
        return
    with postgres_database() as url:
        if url is not None:
            ledger = Ledger.connect(url)
            ledger.migrate()
            ledger.close()
        yield url


def bench_job(size: int, calls: list[str]) -> Any:
    """A job of ``size`` subjects whose transform records each model call in ``calls``."""
    from flows.jobs import Candidate, Job, register
    from flows.model import Model
    from store import OutboxMessage, Period

    def collect(subject: str, period: Period) -> dict[str, Any]:
        return {"subject": subject, "text": f"{subject} raised its prices on {period.label}. "
                "Customers were told by email. The change starts next month."}

    def transform(raw: dict[str, Any], model: Model) -> Candidate:
        calls.append(raw["subject"])
        answer = model.generate(raw["text"])
        return Candidate(answer.text, answer.model, {"subject": raw["subject"]})

    def validate(candidate: Candidate) -> None:
        assert candidate.text

    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return [OutboxMessage("ops@example.com", f"{subject} {period.label}", output["text"])]

    return register(Job(
        name=f"bench-{size}-{uuid.uuid4().hex[:6]}", version="1", cadence="daily",
        timezone="UTC", subjects=[f"s{i:05d}" for i in range(size)], collect=collect,
        transform=transform, validate=validate, messages=messages,
    ))


def bare_flow(job: Any, concurrency: int, model: Any) -> Any:
    """The same stage work as run-job, as Prefect tasks with the same fan-out, without a ledger."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.context import SyncClientContext

    stage: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}

    @task(name="collect", task_run_name="collect[{subject}]", **stage)
    def collect(subject: str, period: Any) -> dict[str, Any]:
        return job.collect(subject, period)  # type: ignore[no-any-return]

    @task(name="transform", task_run_name="transform[{subject}]", **stage)
    def transform(subject: str, raw: dict[str, Any]) -> Any:
        return job.transform(raw, model)

    @task(name="persist", task_run_name="persist[{subject}]", **stage)
    def persist(subject: str, period: Any, candidate: Any) -> int:
        job.validate(candidate)
        return len(job.messages(subject, period, candidate.output()))

    def one(subject: str, period: Any) -> int:
        return persist(subject, period, transform(subject, collect(subject, period)))

    def fan_out(period_text: str) -> int:
        period = job.parse_period(period_text)
        with SyncClientContext.get_or_create(), \
                ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, s, period)
                       for s in job.subject_names()]
            return sum(f.result() for f in futures)

    # Shaped like run_job: an async flow whose sync body runs in a thread, one sync client.
    @flow(name="bare-job", persist_result=False)
    async def bare(period_text: str) -> int:
        return await asyncio.to_thread(fan_out, period_text)

    return bare


def task_runs(flow_run_id: Any) -> int:
    """How many task runs the Prefect server has recorded for a flow run."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        response = client.request("POST", "/task_runs/count",
                                  json={"flow_runs": {"id": {"any_": [str(flow_run_id)]}}})
        response.raise_for_status()
        return int(response.json())


def drain(flow_run_id: Any, expected: int, quiet_seconds: int = 5) -> None:
    """Wait until the server has recorded the flow run's ``expected`` task runs, or recorded no
    more for ``quiet_seconds`` (a server whose in-memory event queue overflowed drops some): it
    records them in the background, and that work would otherwise slow the next measurement."""
    seen, quiet = -1, 0
    while quiet < quiet_seconds and (count := task_runs(flow_run_id)) < expected:
        quiet = quiet + 1 if count == seen else 0
        seen = count
        time.sleep(1)


def timed(work: Callable[[], Any], task_runs_per_call: int) -> tuple[float, float, Any]:
    """Wall seconds and this process's CPU seconds for ``work()`` (a flow call returning its
    state; the CPU figure leaves out the Prefect server's share), then a drained server.

    Each measurement starts from a collected heap: a full collection walks the whole
    import-time heap (0.15-0.25 s here), and whether the previous measurement's garbage
    triggers one inside this one would otherwise decide a ratio at 100 subjects."""
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    state = work()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    drain(state.state_details.flow_run_id, task_runs_per_call)
    return seconds, cpu_seconds, state


def one_round(size: int, delay: float, concurrency: int, bare_first: bool) -> dict[str, Any]:
    """The bare flow and run_job on the same subjects (new periods), then run_job's rerun."""
    from flows.model import OfflineModel
    from flows.pipeline import run_job

    calls: list[str] = []
    job = bench_job(size, calls)
    bare = bare_flow(job, concurrency, OfflineModel(delay_seconds=delay))
    bare_period, job_period = next(PERIODS), next(PERIODS)
    result: dict[str, Any] = {}

    def tick() -> Any:
        return asyncio.run(run_job(job.name, period=job_period, return_state=True))

    for which in ("bare", "run_job") if bare_first else ("run_job", "bare"):
        if which == "bare":
            result["bare_s"], result["bare_cpu_s"], done = timed(
                lambda: asyncio.run(bare(bare_period, return_state=True)), 3 * size)
            assert done.result() == size, done.message
        else:
            result["run_job_s"], result["run_job_cpu_s"], first = timed(tick, 3 * size + 1)
            assert first.name == "Completed", first.message
    before = len(calls)
    result["rerun_s"], _, again = timed(tick, 0)
    assert again.name == "Duplicate", again.message
    result["rerun_model_calls"] = len(calls) - before
    result["first_task_runs"] = task_runs(first.state_details.flow_run_id)
    result["rerun_task_runs"] = task_runs(again.state_details.flow_run_id)
    return result


def measure(size: int, dialect: str, url: str, delay: float, repeat: int) -> dict[str, Any]:
    """Medians over ``repeat`` rounds, alternating whether the bare flow or run_job goes first."""
    from flows.settings import RunledgerSettings

    os.environ["RUNLEDGER_DATABASE_URL"] = url
    concurrency = RunledgerSettings().subject_concurrency
    rounds = [one_round(size, delay, concurrency, bare_first=i % 2 == 0) for i in range(repeat)]
    row: dict[str, Any] = {"subjects": size, "dialect": dialect}
    for key in ("bare_s", "run_job_s", "rerun_s", "bare_cpu_s", "run_job_cpu_s"):
        row[key] = statistics.median(r[key] for r in rounds)
    for key in ("rerun_model_calls", "rerun_task_runs"):
        row[key] = sum(r[key] for r in rounds)
    row["first_task_runs"] = rounds[-1]["first_task_runs"]
    row["ratio"] = row["run_job_s"] / row["bare_s"]
    row["cpu_ratio"] = row["run_job_cpu_s"] / row["bare_cpu_s"]
    # Each round's own ratio: the two flows of a round ran back to back, so drift between
    # rounds (the server's backlog, other load on the machine) cancels out of it.
    paired = sorted(r["run_job_s"] / r["bare_s"] for r in rounds)
    row["paired_ratio"] = statistics.median(paired)
    row["paired_range"] = (paired[0], paired[-1])
    row["paired_cpu_ratio"] = statistics.median(r["run_job_cpu_s"] / r["bare_cpu_s"]
                                                for r in rounds)
    row["interval"] = median_interval(paired) if repeat >= 5 else None
    return row


def interval(row: dict[str, Any]) -> str:
    if row["interval"] is None:
        return ""
    low, high = row["interval"]
    return f", 90% interval {low:.3f}-{high:.3f}: {verdict(low, high)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--dialects", nargs="+", default=["sqlite", "postgres"],
                        choices=["sqlite", "postgres"])
    parser.add_argument("--model-delay", type=float, default=0.0,
                        help="seconds the offline model sleeps per call (a model's latency)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--server", action="store_true",
                        help="start a PostgreSQL-backed Prefect server of this run's own")
    parser.add_argument("--server-nice", type=int, default=10,
                        help="CPU niceness of that server (0: same priority as the flows)")
    args = parser.parse_args()
    if min(args.sizes) < 1 or args.repeat < 1:
        parser.error("--sizes and --repeat must be positive")
    if args.server:
        # Prefect reads PREFECT_API_URL when first imported, and starting the server imports
        # it: the measurements run in a child process that starts with the server's URL.
        with own_server(args.server_nice) as api:
            print(f"Prefect server: {api} (PostgreSQL, nice {args.server_nice})", flush=True)
            child = [a for a in sys.argv[1:] if a != "--server"]
            code = subprocess.run([sys.executable, __file__, *child],
                                  env={**os.environ, "PREFECT_API_URL": api}).returncode
        raise SystemExit(code)
    _prefect_environment()
    os.environ["RUNLEDGER_OFFLINE_MODEL_DELAY_SECONDS"] = str(args.model_delay)
    run(args)


def run(args: argparse.Namespace) -> None:
    from flows.pipeline import run_job

    with tempfile.TemporaryDirectory() as directory:
        for dialect in args.dialects:
            with ledger_url(dialect, Path(directory)) as url:
                if url is None:
                    continue
                warm = bench_job(10, [])
                os.environ["RUNLEDGER_DATABASE_URL"] = url
                warm_up = asyncio.run(run_job(warm.name, period="2025-12-31", return_state=True))
                drain(warm_up.state_details.flow_run_id, 3 * 10 + 1)  # server start-up and imports
                for size in args.sizes:
                    row = measure(size, dialect, url, args.model_delay, args.repeat)
                    low, high = row["paired_range"]
                    print(f"{dialect:8} N={size:5}: bare {row['bare_s']:7.2f} s, run_job "
                          f"{row['run_job_s']:7.2f} s, ratio {row['ratio']:.3f} "
                          f"(target <= {TARGET}), client CPU ratio {row['cpu_ratio']:.3f}; "
                          f"median of {args.repeat} rounds' ratios {row['paired_ratio']:.3f} "
                          f"({low:.3f}-{high:.3f}){interval(row)}, of CPU ratios "
                          f"{row['paired_cpu_ratio']:.3f}; "
                          f"rerun {row['rerun_s']:6.2f} s with {row['rerun_model_calls']} model "
                          f"calls and {row['rerun_task_runs']} task runs "
                          f"(first run: {row['first_task_runs']} task runs)", flush=True)


if __name__ == "__main__":
    main()
