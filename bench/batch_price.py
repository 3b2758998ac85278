"""Batch mode against the synchronous API: the same job of N subjects (one model call each) run
once synchronously and once in batch mode, against one OpenAI-compatible server on loopback
(the same answers and token counts either way), on each ledger. Figures: the ledger's recorded
cost of the batch tick over the synchronous tick's (target 0.50 +/- 0.01: the Batch API's
price), the provider's creates per batch key (target 1), the answered calls per Run (target 1:
none settled twice), every Run completed; the wall time from the batch tick's start to its last
Run completed, and the time a worker was held (the flow runs' wall time: the tick that submits
and the polls; nothing while the provider works).

    uv run python bench/batch_price.py [--subjects 1000] [--dialects sqlite postgres]
                                       [--polls 2] [--poll-interval 1.0]

``--polls``: the server's retrieves answered ``in_progress`` before a batch ends (a provider
at work); ``--poll-interval``: seconds between the settle-batches flow runs."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.batch_provider import BatchServer
from bench.pipeline_bench import bench_job, ledger_url, prefect_environment

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from prefect.client.schemas.objects import State

    from store import Ledger

PRICES = {"gpt-bench": {"input": "2.50", "output": "10.00"}}  # USD per million tokens
RATIO, TOLERANCE = 0.50, 0.01
SYNC_PERIOD, BATCH_PERIOD = "2026-11-02", "2026-11-03"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subjects", type=int, default=1000)
    parser.add_argument("--dialects", nargs="+", default=["sqlite", "postgres"],
                        choices=["sqlite", "postgres"])
    parser.add_argument("--polls", type=int, default=2)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    if args.subjects < 1 or args.polls < 0 or args.poll_interval < 0:
        parser.error("--subjects must be positive, --polls and --poll-interval not negative")
    prefect_environment()
    print(f"batch price bench: {args.subjects} subjects, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC",
          flush=True)
    missed = 0
    with tempfile.TemporaryDirectory() as directory:
        for dialect in args.dialects:
            with ledger_url(dialect, Path(directory)) as url:
                if url is None:
                    print(f"{dialect}: PostgreSQL unreachable, skipped", flush=True)
                    continue
                missed += measure(dialect, url, args)
    raise SystemExit(1 if missed else 0)


def measure(dialect: str, url: str, args: argparse.Namespace) -> int:
    """One ledger's figures, printed; how many targets were missed."""
    from flows.run_job.flow import run_job
    from flows.run_job.outcomes import state_value
    from flows.settle.flow import settle_batches
    from store import Ledger

    with BatchServer() as server:
        server.polls_until_done = args.polls
        os.environ.update({
            "RUNLEDGER_DATABASE_URL": url, "RUNLEDGER_MODEL": "openai",
            "RUNLEDGER_MODEL_BASE_URL": server.base_url, "RUNLEDGER_MODEL_NAME": "gpt-bench",
            "RUNLEDGER_MODEL_API_KEY": "sk-bench", "RUNLEDGER_MODEL_CURRENCY": "USD",
            "RUNLEDGER_MODEL_PRICES": json.dumps(PRICES)})
        job = bench_job(args.subjects, [])
        ledger = Ledger.connect(url)
        try:
            flow(settle_batches(return_state=True))  # Prefect's server started, imports done
            began = time.perf_counter()
            flow(run_job(job.name, period=SYNC_PERIOD, batch=False, return_state=True))
            sync_held = time.perf_counter() - began
            began = time.perf_counter()
            tick = flow(run_job(job.name, period=BATCH_PERIOD, batch=True, return_state=True))
            held = time.perf_counter() - began
            waiting = tick.name == "AwaitingBatch"
            polls = 0
            while waiting and time.perf_counter() - began < 3600:
                time.sleep(args.poll_interval)
                started = time.perf_counter()
                report = state_value(flow(settle_batches(return_state=True)))
                held += time.perf_counter() - started
                polls += 1
                waiting = bool(ledger.batches.waiting_runs(job.name)
                               or ledger.batches.released_runs()) or report is None
            done_at = time.perf_counter() - began
            return report_figures(dialect, ledger, job.name, server, args.subjects, sync_held,
                                  held, done_at, polls)
        finally:
            ledger.close()


def flow(call: Any) -> State[Any]:
    """The final state of a flow called with ``return_state=True``."""
    return asyncio.run(cast("Coroutine[Any, Any, State[Any]]", call))


def report_figures(dialect: str, ledger: Ledger, job: str, server: BatchServer, size: int,
                   sync_held: float, batch_held: float, done_at: float, polls: int) -> int:
    """Print one ledger's figures against their targets; how many were missed."""
    runs = {r.run_id: r for r in ledger.runs(job=job, limit=10 * size)}
    calls = ledger.calls.of_runs(list(runs))
    cost = Counter[str]()
    answered = Counter[str]()
    for run_id, found in calls.items():
        period = runs[run_id].period_start.date().isoformat()
        for call in found:
            if call.outcome == "answered":
                answered[run_id] += 1
                cost[period] += call.cost_nanos or 0
    ratio = cost["2026-11-03"] / cost["2026-11-02"] if cost["2026-11-02"] else float("nan")
    creates = set(server.creates_by_key.values())
    completed = sum(r.status == "completed" for r in runs.values())
    checks = {
        f"cost ratio batch : synchronous {ratio:.4f} (target {RATIO} +/- {TOLERANCE})":
            abs(ratio - RATIO) <= TOLERANCE,
        f"creates per batch key {sorted(creates)} (target [1])": creates == {1},
        f"answered calls per Run {sorted(set(answered.values()))} (target [1])":
            set(answered.values()) == {1} and len(answered) == 2 * size,
        f"Runs completed {completed} of {2 * size}": completed == 2 * size,
    }
    print(f"{dialect:8} N={size}: synchronous tick held a worker {sync_held:.1f} s; batch: "
          f"{len(server.created)} batch(es), last Run completed {done_at:.1f} s after the "
          f"tick started, a worker held {batch_held:.1f} s ({polls} polls)", flush=True)
    for text, met in checks.items():
        print(f"{dialect:8} N={size}: {text}: {'met' if met else 'MISSED'}", flush=True)
    return sum(not met for met in checks.values())


if __name__ == "__main__":
    main()
