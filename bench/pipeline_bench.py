"""run_job against a bare Prefect flow and Prefect's own idempotent version of the job, in one run.

    uv run python bench/pipeline_bench.py [--sizes 100 1000] [--dialects sqlite postgres]
                                          [--model-delay 0] [--repeat 1] [--server]

Each round runs, on new periods and in an order rotated from round to round:

- bare: a flow shaped like ``run_job`` (an async flow whose sync body runs in a thread with one
  Prefect client, the same fan-out) running the same job's collect, transform (offline model) and
  validate + messages as Prefect tasks per subject, with no ledger and no safety at all;
- run_job on a fresh ledger (one register+claim task run for the tick, then collect, transform,
  persist per subject, plus the batched read, the lease keeper, artifact and events);
- Prefect-native (``bench/prefect_native.py``), once with the Redis lock manager and once with the
  file-system one: every stage a task cached under (job, version, period, subject, stage), results
  persisted, SERIALIZABLE transactions, emails sent from the persist task's commit hook to an SMTP
  sink in a process of its own;

then the rerun of each safe version's completed tick: run_job's must call no model and start no
task run; Prefect-native's calls no model and sends no email but still creates a cached task run
per stage and subject.

Decisive measure: this process's CPU seconds (it leaves out the Prefect server's and the sink's
share); wall times are printed beside them. Targets, judged on each round's own ratio (the flows
of a round run back to back, so drift between rounds cancels out of it): run_job's first run at
most 1.15x the bare flow's client CPU and at most 0.8x Prefect-native's; its rerun of a completed
tick at least 10x faster (wall) than Prefect-native's rerun. With --repeat 5 or more each verdict
takes a 90 % bootstrap interval of the median ratio: met when the whole interval is on the
target's side, missed when all of it is on the other, undecided otherwise.

Prefect: with --server, a `prefect server start` of the script's own on a new PostgreSQL
database, dropped afterwards, run at a lower CPU priority (--server-nice), it and the PostgreSQL
backends serving its database, so that on a machine shared with it the server's background work
(recording task runs and events) does not take the flows' CPU, as when the server and its
database run on a host of their own; else PREFECT_API_URL if set; else a temporary local server
on SQLite. Logs at WARNING so that every flow pays the same small logging cost. PostgreSQL
ledgers are skipped when unreachable (RUNLEDGER_BENCH_POSTGRES_URL, default
postgresql+psycopg://postgres@127.0.0.1:5432/postgres). Redis: 127.0.0.1:6379."""

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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from bench.databases import postgres_database

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from prefect.client.schemas.objects import State

TARGET = 1.15  # run_job's first run : the bare flow's, client CPU, at most
NATIVE_TARGET = 0.8  # run_job's first run : Prefect-native's, client CPU, at most
RERUN_TARGET = 10.0  # Prefect-native's rerun : run_job's rerun, wall, at least
LOCKS = ("redis", "file")
PERIODS = iter(f"2026-{month:02d}-{day:02d}" for month in range(1, 13) for day in range(1, 29))


def prefect_environment() -> None:
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
                print(f"The server's database {url.rsplit('/', 1)[1]}: {len(reniced.pids)} "
                      f"PostgreSQL backends kept at nice {nice}", flush=True)
                if reniced.error is not None:
                    print(f"WARNING: stopped renicing its new backends: {reniced.error!r}",
                          flush=True)
        finally:
            supervisor.stop()


def run_with_own_server(script: str, nice: int) -> int:
    """Run ``script`` again with this process's arguments but ``--server``, in a child process
    whose PREFECT_API_URL is a server of this run's own (``own_server``); its exit status.

    Prefect reads PREFECT_API_URL when first imported, and starting the server imports it:
    the measurements run in a child process that starts with the server's URL."""
    with own_server(nice) as api:
        print(f"Prefect server: {api} (PostgreSQL, nice {nice})", flush=True)
        child = [a for a in sys.argv[1:] if a != "--server"]
        return subprocess.run([sys.executable, script, *child],
                              env={**os.environ, "PREFECT_API_URL": api}).returncode


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


def verdict(low: float, high: float, target: float = TARGET, at_most: bool = True) -> str:
    """Met when the whole interval is on the target's side (at or below it, or with ``at_most``
    false at or above it), missed when all of it is on the other side, else undecided."""
    if (high <= target) if at_most else (low >= target):
        return "target met"
    if (low > target) if at_most else (high < target):
        return "target missed"
    return "undecided"


@contextmanager
def ledger_url(dialect: str, directory: Path) -> Iterator[str | None]:
    """A fresh migrated ledger of ``dialect``; None when PostgreSQL is unreachable."""
    from store import Ledger

    if dialect == "sqlite":
        url: str | None = f"sqlite:///{directory / f'ledger-{uuid.uuid4().hex[:6]}.db'}"
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
    from flows.jobs import Candidate, Job
    from flows.model import Model
    from flows.registry import register
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


@contextmanager
def smtp_sink() -> Iterator[tuple[tuple[str, int], Path]]:
    """An SMTP sink in a process of its own (its CPU is not the flows'): its address and the
    stats file it keeps current."""
    with tempfile.TemporaryDirectory() as maildir, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        sink = subprocess.Popen(
            [sys.executable, "-c", "from flows.cli import main; main()", "sink", "--maildir",
             maildir, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if time.monotonic() > deadline or sink.poll() is not None:
                    raise SystemExit("the SMTP sink did not start")
                time.sleep(0.1)
            yield ("127.0.0.1", port), Path(maildir) / "stats.json"
        finally:
            sink.terminate()
            sink.wait(30)


def received(stats: Path) -> int:
    """Messages the sink has accepted so far."""
    import json

    return int(json.loads(stats.read_text())["received"]) if stats.exists() else 0


def one_round(size: int, delay: float, concurrency: int, order: list[str],
              smtp: tuple[str, int], stats: Path, storage: Path) -> dict[str, Any]:
    """Each flow of ``order`` on the same subjects (new periods), then the safe versions'
    reruns of their completed ticks."""
    from bench.prefect_native import native_flow
    from flows.model import OfflineModel
    from flows.run_job.flow import run_job

    calls: list[str] = []
    job = bench_job(size, calls)
    model = OfflineModel(delay_seconds=delay)
    flows: dict[str, Any] = {"bare": bare_flow(job, concurrency, model)}
    for lock in LOCKS:
        flows[f"native_{lock}"] = native_flow(
            job, model, lock=lock, storage=storage / f"{job.name}-{lock}", smtp=smtp,
            concurrency=concurrency)
    periods = {name: next(PERIODS) for name in ("bare", "run_job", *flows)}
    result: dict[str, Any] = {}

    def call(name: str) -> Any:
        if name == "run_job":
            # Prefect types an async flow's call as an Awaitable; asyncio.run takes the coroutine.
            return asyncio.run(cast("Coroutine[Any, Any, State[Any]]",
                                    run_job(job.name, period=periods[name], return_state=True)))
        return asyncio.run(flows[name](periods[name], return_state=True))

    for name in order:
        result[f"{name}_s"], result[f"{name}_cpu_s"], done = timed(
            partial(call, name), 3 * size + (name == "run_job"))
        assert done.name == "Completed", done.message
        if name == "run_job":
            first = done
        else:
            assert done.result() == size, done.message
    for name in ("run_job", *(f"native_{lock}" for lock in LOCKS)):
        before, sent = len(calls), received(stats)
        result[f"{name}_rerun_s"], result[f"{name}_rerun_cpu_s"], again = timed(
            partial(call, name), 0 if name == "run_job" else 3 * size)
        assert again.name == ("Cached" if name == "run_job" else "Completed"), again.message
        result[f"{name}_rerun_model_calls"] = len(calls) - before
        result[f"{name}_rerun_emails"] = received(stats) - sent
        result[f"{name}_rerun_task_runs"] = task_runs(again.state_details.flow_run_id)
    result["first_task_runs"] = task_runs(first.state_details.flow_run_id)
    return result


FLOWS = ["bare", "run_job", *(f"native_{lock}" for lock in LOCKS)]


def judged(ratios: list[float], target: float, at_most: bool) -> str:
    """The median of ``ratios``, their range and (five or more) the interval's verdict."""
    ordered = sorted(ratios)
    text = f"{statistics.median(ordered):.3f} ({ordered[0]:.3f}-{ordered[-1]:.3f})"
    if len(ordered) >= 5:
        low, high = median_interval(ordered)
        sign = "<=" if at_most else ">="
        text += (f", 90% interval {low:.3f}-{high:.3f}: {verdict(low, high, target, at_most)} "
                 f"({sign} {target:g})")
    return text


def measure(size: int, dialect: str, url: str, delay: float, repeat: int,
            smtp: tuple[str, int], stats: Path, storage: Path) -> dict[str, Any]:
    """Medians over ``repeat`` rounds, the order of the flows rotated from round to round."""
    from flows.settings import RunledgerSettings

    os.environ["RUNLEDGER_DATABASE_URL"] = url
    concurrency = RunledgerSettings().subject_concurrency
    rounds = [one_round(size, delay, concurrency, FLOWS[i % 4:] + FLOWS[:i % 4], smtp, stats,
                        storage) for i in range(repeat)]
    row: dict[str, Any] = {"subjects": size, "dialect": dialect, "rounds": rounds}
    for key in rounds[0]:
        if key.endswith("_s"):
            row[key] = statistics.median(r[key] for r in rounds)
        else:
            row[key] = sum(r[key] for r in rounds)
    row["first_task_runs"] = rounds[-1]["first_task_runs"]
    return row


def report(row: dict[str, Any]) -> None:
    rounds = row["rounds"]
    head = f"{row['dialect']:8} N={row['subjects']:5}:"
    times = ", ".join(f"{name} {row[f'{name}_cpu_s']:.2f} s CPU / {row[f'{name}_s']:.2f} s wall"
                      for name in FLOWS)
    print(f"{head} first run, medians of {len(rounds)} rounds: {times}", flush=True)
    print(f"{head} run_job : bare, client CPU "
          f"{judged([r['run_job_cpu_s'] / r['bare_cpu_s'] for r in rounds], TARGET, True)}; "
          f"wall {statistics.median(r['run_job_s'] / r['bare_s'] for r in rounds):.3f}",
          flush=True)
    for lock in LOCKS:
        native = f"native_{lock}"
        print(f"{head} run_job : Prefect-native ({lock} locks), client CPU "
              f"{judged([r['run_job_cpu_s'] / r[f'{native}_cpu_s'] for r in rounds], NATIVE_TARGET, True)}"
              f"; wall {statistics.median(r['run_job_s'] / r[f'{native}_s'] for r in rounds):.3f}",
              flush=True)
    reruns = ", ".join(
        f"{name} {row[f'{name}_rerun_cpu_s']:.2f} s CPU / {row[f'{name}_rerun_s']:.2f} s wall "
        f"with {row[f'{name}_rerun_model_calls']} model calls, {row[f'{name}_rerun_emails']} "
        f"emails and {row[f'{name}_rerun_task_runs']} task runs"
        for name in ("run_job", *(f"native_{lock}" for lock in LOCKS)))
    print(f"{head} rerun of the completed tick, medians (calls, emails and task runs summed over "
          f"the rounds): {reruns} (run_job's first run: {row['first_task_runs']} task runs)",
          flush=True)
    for lock in LOCKS:
        native = f"native_{lock}_rerun_s"
        print(f"{head} rerun speed-up over Prefect-native ({lock} locks), wall "
              f"{judged([r[native] / r['run_job_rerun_s'] for r in rounds], RERUN_TARGET, False)}",
              flush=True)


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
        raise SystemExit(run_with_own_server(__file__, args.server_nice))
    prefect_environment()
    os.environ["RUNLEDGER_OFFLINE_MODEL_DELAY_SECONDS"] = str(args.model_delay)
    run(args)


def run(args: argparse.Namespace) -> None:
    from flows.run_job.flow import run_job

    print(f"pipeline bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC", flush=True)
    with tempfile.TemporaryDirectory() as directory, smtp_sink() as (smtp, stats):
        for dialect in args.dialects:
            with ledger_url(dialect, Path(directory)) as url:
                if url is None:
                    continue
                warm = bench_job(10, [])
                os.environ["RUNLEDGER_DATABASE_URL"] = url
                warm_up = asyncio.run(cast(  # the Awaitable typing of a flow call, as in one_round
                    "Coroutine[Any, Any, State[Any]]",
                    run_job(warm.name, period="2025-12-31", return_state=True)))
                drain(warm_up.state_details.flow_run_id, 3 * 10 + 1)  # server start-up and imports
                for size in args.sizes:
                    row = measure(size, dialect, url, args.model_delay, args.repeat, smtp, stats,
                                  Path(directory))
                    report(row)
                    print(f"{dialect:8} N={size:5}: load average {os.getloadavg()[0]:.2f}",
                          flush=True)


if __name__ == "__main__":
    main()
