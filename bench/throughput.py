"""A model-bound tick against a rate-limited provider: runledger in one worker process,
runledger's tick sharded over a work pool of several worker processes, and a Prefect-native
flow, on the same rate-limited OpenAI-compatible server on loopback.

    uv run python bench/throughput.py [--subjects 400] [--rate 20] [--latencies 0.2 1 5]
                                      [--workers 3] [--at-once 64]
                                      [--contenders one pool native learned silent]
                                      [--database-url URL] [--timeline 10]

The server (bench/limited_provider.py) answers each call after L seconds, accepts R calls a
second (a token bucket of one second's worth) and refuses the rest with 429 and Retry-After: 1;
it counts accepted calls, 429s and the peak in flight. For each latency L, in this order:

- runledger, 1 process: one tick of N subjects (bench/volume_tick.py: a job whose transform
  makes one call) in a worker process of its own, the default endpoint configured at R*60
  requests per minute and max_concurrent ceil(1.5 R L) + 1 (the threads it sizes);
- runledger, W processes: the same tick as a flow run of a deployment (bench/volume_flow.py)
  with ``shard_size`` ceil(N / W), on a process work pool served by W ``prefect worker``
  processes: the tick's flow run starts W shard flow runs, which the workers take; the
  endpoint's limits are shared through the ledger;
- runledger, nothing configured (``learned``): the tick of the first contender with no limit
  configured and RUNLEDGER_SUBJECT_CONCURRENCY --at-once (64), against the server announcing
  its limits as OpenAI does on every answer (``x-ratelimit-*``: R a minute): the endpoint
  sends one call first and adopts the announced rate from its answer (store/endpoint_limits.py);
- runledger, nothing configured, against a server that announces nothing (``silent``): the
  rate is learned from the 429s only;
- Prefect-native: a flow of N tasks ``.map``ped on a ThreadPoolTaskRunner of as many threads,
  each taking ``rate_limit`` of a global concurrency limit of R slots decaying at R a second,
  then making the call with the openai SDK (6 task retries, 1 s apart), in a process of its own.

Printed per contender: the wall time from the first call the server received to the tick's
end, its ratio to the floor N / R, the calls accepted and refused (429), the peak in flight,
failed subjects, CPU milliseconds per subject of the worker processes (with the flow-run
processes they start) and of the server (this process's own CPU over the contender's run),
and runledger's peak RSS in one process; with ``--timeline S``, each contender's accepted
calls per S seconds and when its 429s arrived. ``--threads 8 256`` runs runledger alone once per
thread count (RUNLEDGER_SUBJECT_CONCURRENCY), for memory per thread. Prefect: PREFECT_API_URL
if set, else a temporary local server (bench/pipeline_bench.py's). Ledger: a new SQLite file
per latency (and one per nothing-configured contender: what the endpoint learned stays in its
ledger row), or --database-url (where a nothing-configured contender starts from what the
runs before it left in the endpoint's row)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from prefect.futures import PrefectFuture
    from prefect.task_runners import TaskRunner

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from bench.limited_provider import Announce, Arrivals, LimitedModelServer  # noqa: E402

PERIOD = "2026-12-01"
# runledger in one worker process; runledger's tick sharded over a work pool of --workers
# worker processes; the Prefect-native flow.
CONTENDERS = ("one", "pool", "native", "learned", "silent")
LIMIT = "bench-provider"


@dataclass
class Result:
    contender: str
    latency: float
    seconds: float
    floor: float
    accepted: int
    refused: int
    peak: int
    failed: int
    worker_cpu_ms: float
    server_cpu_ms: float
    worker_rss_mib: float | None
    arrivals: Arrivals

    def row(self) -> str:
        rss = "" if self.worker_rss_mib is None else f"{self.worker_rss_mib:.0f}"
        return (f"| {self.contender} | {self.latency:g} | {self.seconds:.1f} | "
                f"{self.seconds / self.floor:.2f}x | {self.accepted} | {self.refused} | "
                f"{self.peak} | {self.failed} | {self.worker_cpu_ms:.1f} | "
                f"{self.server_cpu_ms:.1f} | {rss} |")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_process(args: list[str], env: dict[str, str]) -> tuple[str, float, float]:
    """Run a worker process to its end: its stdout, its CPU seconds and when it ended."""
    process = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    out, err = process.communicate()
    ended = time.time()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # cumulative: the caller subtracts
    if process.returncode != 0:
        raise SystemExit(f"{args[:4]} failed:\n{err[-3000:]}")
    return out, usage.ru_utime + usage.ru_stime, ended


def measure(contender: str, latency: float, n: int, rate: float, args: list[str],
            env: dict[str, str], failed_of: Any, rss_of: Any = None,
            announce: Announce | None = None) -> Result:
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = children_before.ru_utime + children_before.ru_stime
    with LimitedModelServer(rate, latency, announce=announce) as server:
        env = {**env, "BENCH_MODEL_URL": server.base_url,
               "RUNLEDGER_MODEL_BASE_URL": server.base_url}
        server_before = cpu_seconds()
        out, after, ended = run_process(args, env)
        server_cpu = cpu_seconds() - server_before
    seen = server.seen
    first = min(seen.accepted + seen.refused)
    return Result(contender, latency, ended - first, n / rate, len(seen.accepted),
                  len(seen.refused), seen.peak_in_flight, failed_of(out),
                  (after - before) * 1000 / n, server_cpu * 1000 / n,
                  None if rss_of is None else rss_of(out), seen)


def runledger(n: int, rate: float, latency: float, api: str, database_url: str,
              threads: int | None, announce: Announce | None = None,
              configured: bool = True) -> Result:
    """``threads``: RUNLEDGER_SUBJECT_CONCURRENCY (else sized from the endpoint's maximum);
    ``configured``: the endpoint's limits set (else none: learned from the server, which
    ``announce``s its limits or not)."""
    env = runledger_env(n, rate, latency, api, database_url, configured)
    if threads is not None:
        env["RUNLEDGER_SUBJECT_CONCURRENCY"] = str(threads)
    job = f"throughput-{uuid.uuid4().hex[:8]}"

    def failed(out: str) -> int:
        counts = json.loads(out.strip().splitlines()[-1])["outcomes"]
        return n - int(counts.get("new", 0))

    def rss(out: str) -> float:
        return int(json.loads(out.strip().splitlines()[-1])["vm_hwm_kib"]) / 1024

    name = "runledger, 1 process" + ("" if threads is None else f", {threads} threads")
    if not configured:
        name = (f"runledger, nothing configured, {threads} at once, "
                f"{'announced' if announce else 'silent'}")
    return measure(name, latency, n, rate,
                   [sys.executable, "-m", "bench.volume_tick", job, str(n), PERIOD],
                   env, failed, rss, announce)


def runledger_env(n: int, rate: float, latency: float, api: str, database_url: str,
                  configured: bool = True) -> dict[str, str]:
    """A runledger worker's environment: the default endpoint at R a second and
    ``ceil(1.5 R L) + 1`` calls in flight (the threads a tick sizes from it); not
    ``configured``: no limit at all."""
    allowed = math.ceil(1.5 * rate * latency) + 1
    limits = {"RUNLEDGER_MODEL_REQUESTS_PER_MINUTE": str(rate * 60),
              "RUNLEDGER_MODEL_MAX_CONCURRENT": str(allowed)} if configured else {}
    return {**os.environ, "PREFECT_API_URL": api, "RUNLEDGER_DATABASE_URL": database_url,
            "RUNLEDGER_MODEL": "openai", "RUNLEDGER_MODEL_NAME": "probe-model", **limits,
            "PREFECT_LOGGING_LEVEL": "WARNING"}


def runledger_pool(n: int, rate: float, latency: float, api: str, database_url: str,
                   workers: int) -> Result:
    """One tick of N subjects as a flow run of a deployment on a process work pool served by
    ``workers`` `prefect worker` processes, its ``shard_size`` ceil(N / workers): the tick's
    flow run starts that many shard flow runs, which the workers take. Timed from the
    server's first call to the tick's final state; CPU of the workers and every flow-run
    process they started (each worker is stopped, and so reaped, before it is read)."""
    from prefect.client.orchestration import get_client

    from flows.run_job.flow import run_job
    from flows.stack import commands
    from flows.stack.work_pool import ensure_pool
    from store import Ledger

    job = f"throughput-{uuid.uuid4().hex[:8]}"
    pool = f"bench-{job}"
    env = {**runledger_env(n, rate, latency, api, database_url), "BENCH_JOB": job,
           "BENCH_SUBJECTS": str(n), "PYTHONPATH": str(ROOT),
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    os.environ["PREFECT_API_URL"] = api
    with get_client(sync_client=True) as client:
        ensure_pool(client, pool)
        deployment = client.create_deployment(
            flow_id=client.create_flow_from_name(run_job.name), name=job,
            work_pool_name=pool, entrypoint="bench.volume_flow.run_job", path=str(ROOT),
            parameter_openapi_schema=run_job.parameters.model_dump(mode="json"),
            parameters={"job": job, "period": PERIOD, "shard_size": math.ceil(n / workers)},
            job_variables={"working_dir": str(ROOT)},
            pull_steps=[{"prefect.deployments.steps.set_working_directory":
                         {"directory": str(ROOT)}}])
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = children_before.ru_utime + children_before.ru_stime
    with LimitedModelServer(rate, latency) as server:
        env["RUNLEDGER_MODEL_BASE_URL"] = server.base_url
        started = [subprocess.Popen(commands.worker_argv(pool, f"{pool}-{i}"), env=env,
                                    cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL) for i in range(workers)]
        try:
            server_before = cpu_seconds()
            deadline = time.monotonic() + max(600.0, 20 * n / rate)
            with get_client(sync_client=True) as client:
                flow_run = client.create_flow_run_from_deployment(deployment)
                while True:
                    found = client.read_flow_run(flow_run.id)
                    if found.state is not None and found.state.is_final():
                        break
                    if time.monotonic() > deadline:
                        raise SystemExit(
                            f"the tick's flow run {flow_run.id} has not ended in "
                            f"{max(600.0, 20 * n / rate):.0f} s (state "
                            f"{found.state.name if found.state else None}): the work-pool "
                            f"contender needs a PostgreSQL-backed Prefect server in "
                            f"PREFECT_API_URL (a SQLite-backed one locks under its workers)")
                    time.sleep(0.5)
            ended = found.state.timestamp.timestamp()
            server_cpu = cpu_seconds() - server_before
        finally:
            for process in started:
                process.terminate()
            for process in started:
                process.wait()
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = children_after.ru_utime + children_after.ru_stime
    with Ledger.connect(database_url) as ledger:
        completed = len(ledger.runs(job=job, status="completed", limit=n))
    seen = server.seen
    first = min(seen.accepted + seen.refused)
    return Result(f"runledger, {workers} processes (shards)", latency, ended - first, n / rate,
                  len(seen.accepted), len(seen.refused), seen.peak_in_flight, n - completed,
                  (after - before) * 1000 / n, server_cpu * 1000 / n, None, seen)


def native(n: int, rate: float, latency: float, api: str) -> Result:
    threads = math.ceil(1.5 * rate * latency) + 1
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_LOGGING_LEVEL": "WARNING"}
    return measure("Prefect-native, rate_limit", latency, n, rate,
                   [sys.executable, __file__, "--native-worker", str(n), str(threads)], env,
                   lambda out: int(json.loads(out.strip().splitlines()[-1])["failed"]))


def native_worker(n: int, threads: int) -> None:
    """The Prefect-native flow, in a process of its own (see the module's docstring)."""
    import openai
    from prefect import flow, task
    from prefect.concurrency.sync import rate_limit
    from prefect.task_runners import ThreadPoolTaskRunner

    client = openai.OpenAI(base_url=os.environ["BENCH_MODEL_URL"], api_key="none",
                           max_retries=0)

    @task(retries=6, retry_delay_seconds=1, persist_result=False)
    def transform(subject: str) -> str:
        rate_limit(LIMIT)
        answer = client.chat.completions.create(model="probe-model", messages=[
            {"role": "user", "content": f"{subject} raised its prices."}])
        return answer.choices[0].message.content or ""

    # Prefect's TaskRunner is invariant in its future type, so its own ThreadPoolTaskRunner is not
    # the TaskRunner[PrefectFuture[Any]] the decorator declares.
    runner = cast("TaskRunner[PrefectFuture[Any]]", ThreadPoolTaskRunner(max_workers=threads))

    @flow(task_runner=runner, persist_result=False)
    def tick_states(subjects: list[str]) -> int:
        futures = transform.map(subjects)
        futures.wait()
        return sum(1 for f in futures if not f.state.is_completed())

    failed = tick_states([f"s{i:05d}" for i in range(n)])
    print(json.dumps({"failed": failed}), flush=True)


def reset_limit(api: str, rate: float) -> None:
    """A global concurrency limit of ``rate`` slots freed at ``rate`` a second, new each run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    async def make() -> None:
        async with get_client() as client:
            with contextlib.suppress(Exception):  # none yet
                await client.delete_global_concurrency_limit_by_name(LIMIT)
            await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                name=LIMIT, limit=int(rate), slot_decay_per_second=rate))

    os.environ["PREFECT_API_URL"] = api
    asyncio.run(make())


def acquisition_cost(api: str, database_url: str, calls: int = 300) -> None:
    """Milliseconds per acquisition, one thread, nothing ever waited for: Prefect's
    ``rate_limit`` (a limit with room for all) against runledger's limiter (the statement it
    adds to the transaction that records each call: the same calls recorded with and without)."""
    from datetime import UTC, datetime

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import rate_limit

    from store import Intent, Ledger, Limits, RunIdentity, Slot

    async def make() -> None:
        async with get_client() as client:
            with contextlib.suppress(Exception):
                await client.delete_global_concurrency_limit_by_name("bench-cost")
            await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                name="bench-cost", limit=100_000, slot_decay_per_second=100_000))

    os.environ["PREFECT_API_URL"] = api
    asyncio.run(make())
    rate_limit("bench-cost")  # the client's first use: connection set-up
    started = time.perf_counter()
    for _ in range(calls):
        rate_limit("bench-cost")
    prefect_ms = (time.perf_counter() - started) * 1000 / calls

    def recorded(limited: bool) -> float:
        job = f"cost-{uuid.uuid4().hex[:8]}"
        with Ledger.connect(database_url) as ledger:
            ledger.calls.configure_endpoint(job, Limits(max_concurrent=100_000))
            claims = []
            for i in range(calls):
                found = ledger.register_and_claim_many(
                    [(RunIdentity(job, f"s{i}", datetime(2026, 12, 1, tzinfo=UTC), "1"), {})],
                    owner="bench", lease=600)
                claim = next(iter(found.values())).claim
                assert claim is not None
                claims.append(claim)
            slot = Slot(job, 100, 60.0, bounds_in_flight=True) if limited else None
            started = time.perf_counter()
            for claim in claims:
                ledger.calls.record_intent(claim, Intent(job, "m", 0, "0" * 64, slot=slot))
            return (time.perf_counter() - started) * 1000 / calls

    plain, limited = recorded(False), recorded(True)
    print(f"Prefect rate_limit: {prefect_ms:.2f} ms per acquisition (one round trip to the "
          f"Prefect server each); runledger: recording a call {plain:.2f} ms without the "
          f"limiter, {limited:.2f} ms with it (+{limited - plain:.2f} ms) on {database_url}")


def prefect_api() -> Any:
    from bench.behaviour import prefect_api as found

    return found()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=400)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.2, 1.0, 5.0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="runledger only, once per thread count (RUNLEDGER_SUBJECT_"
                             "CONCURRENCY): the peak RSS at 8 and 256")
    parser.add_argument("--workers", type=int, default=3,
                        help="worker processes of the work-pool contender")
    parser.add_argument("--at-once", type=int, default=64,
                        help="subjects at once of the nothing-configured contenders")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS),
                        help="which to run (default: all five)")
    parser.add_argument("--timeline", type=float, default=None, metavar="SECONDS",
                        help="after the table, each contender's accepted calls per SECONDS "
                             "and when its 429s came")
    parser.add_argument("--acquisition-cost", action="store_true",
                        help="measure one acquisition's cost, Prefect's and runledger's, only")
    parser.add_argument("--native-worker", nargs=2, type=int, default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.native_worker:
        native_worker(*args.native_worker)
        return
    from store import Ledger

    rows = []
    with prefect_api() as api, tempfile.TemporaryDirectory() as folder:
        if args.acquisition_cost:
            url = args.database_url or f"sqlite:///{folder}/cost.db"
            with Ledger.connect(url) as ledger:
                ledger.migrate()
            acquisition_cost(api, url)
            return
        for latency in args.latencies:
            url = args.database_url or f"sqlite:///{folder}/ledger-{latency:g}.db"
            with Ledger.connect(url) as ledger:
                ledger.migrate()
            if args.threads:
                for threads in args.threads:
                    rows.append(runledger(args.subjects, args.rate, latency, api, url, threads))
                    print(rows[-1].row(), flush=True)
                continue
            if "one" in args.contenders:
                rows.append(runledger(args.subjects, args.rate, latency, api, url, None))
                print(rows[-1].row(), flush=True)
            if "pool" in args.contenders:
                rows.append(runledger_pool(args.subjects, args.rate, latency, api, url,
                                           args.workers))
                print(rows[-1].row(), flush=True)
            if "native" in args.contenders:
                reset_limit(api, args.rate)
                rows.append(native(args.subjects, args.rate, latency, api))
                print(rows[-1].row(), flush=True)
            for contender, announce in (("learned", "openai"), ("silent", None)):
                if contender not in args.contenders:
                    continue
                own = args.database_url or f"sqlite:///{folder}/{contender}-{latency:g}.db"
                with Ledger.connect(own) as ledger:
                    ledger.migrate()
                rows.append(runledger(args.subjects, args.rate, latency, api, own,
                                      args.at_once, cast("Announce | None", announce),
                                      configured=False))
                print(rows[-1].row(), flush=True)
    print(f"\nN = {args.subjects}, R = {args.rate:g}/s, floor N/R = "
          f"{args.subjects / args.rate:.1f} s\n")
    print("| contender | L (s) | wall (s) | / floor | accepted | 429s | peak in flight | "
          "failed | worker CPU ms/subject | server CPU ms/subject | worker peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row.row())
    if args.timeline:
        print()
        for row in rows:
            print(f"- {row.contender}, L = {row.latency:g} s: "
                  f"{row.arrivals.timeline(args.timeline)}")


if __name__ == "__main__":
    main()
