"""Batch mode against the synchronous API: the same job of N subjects (one model call each) run
once synchronously and once in batch mode, against one provider's server on loopback (the same
answers and token counts either way), on each ledger: ``--provider openai`` (default), an
OpenAI-compatible server with the Files and Batches API (``bench/batch_provider.py``);
``--provider anthropic``, Anthropic's Messages API with its Message Batches
(``bench/anthropic_batch_provider.py``). Figures: the ledger's recorded cost of the batch tick
over the synchronous tick's (target 0.50 +/- 0.01: the Batch API's price), each batch created
once (OpenAI: the provider's creates per batch key, target 1; Anthropic, whose batches carry
no key: the ledger batches that name each provider batch, and the provider batches each
custom_id was sent in, target 1 each), the answered calls per Run (target 1: none settled
twice), every Run completed; the wall time from the batch tick's start to its last Run
completed, and the time a worker was held (each flow run's wall time), split into the tick
that submits, the polls that found the batch still at work at the provider, and the polls that
settled it and finished the Runs; between polls, while the provider works, none is held.

    uv run python bench/batch_price.py [--subjects 1000] [--dialects sqlite postgres]
                                       [--provider openai] [--polls 3] [--poll-interval 10]
                                       [--server]

``--polls``: the server's retrieves answered ``in_progress`` before a batch ends (a provider
at work for about ``polls`` x ``poll-interval`` seconds); ``--poll-interval``: seconds between
the settle-batches flow runs. Prefect: with ``--server``, a PostgreSQL-backed ``prefect server
start`` of the script's own (``bench.pipeline_bench.own_server``; a tick of 1,000 subjects is
more than the temporary SQLite server keeps up with: it answered 503), at CPU priority
``--server-nice`` (default 0: the wall times measured include its answers); else
PREFECT_API_URL if set; else a temporary local server on SQLite."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.anthropic_batch_provider import AnthropicBatchServer
from bench.batch_provider import BatchServer
from bench.pipeline_bench import bench_job, ledger_url, prefect_environment, run_with_own_server

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from prefect.client.schemas.objects import State

    from store import Ledger

Server = BatchServer | AnthropicBatchServer


@dataclass(frozen=True)
class Provider:
    """A provider's API on loopback and the settings that send the job's calls to it."""

    kind: Literal["openai", "anthropic"]  # RUNLEDGER_MODEL
    server: type[Server]
    model: str
    key: str
    api: str  # what the server is, for the output


PROVIDERS = {
    "openai": Provider("openai", BatchServer, "gpt-bench", "sk-bench",
                       "OpenAI's Files and Batches API (bench/batch_provider.py)"),
    "anthropic": Provider("anthropic", AnthropicBatchServer, "claude-bench", "sk-ant-bench",
                          "Anthropic's Message Batches (bench/anthropic_batch_provider.py)"),
}
# USD per million tokens, the same for either provider: the ratio is what is measured.
PRICES = {p.model: {"input": "2.50", "output": "10.00"} for p in PROVIDERS.values()}
RATIO, TOLERANCE = 0.50, 0.01
SYNC_PERIOD, BATCH_PERIOD = "2026-11-02", "2026-11-03"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subjects", type=int, default=1000)
    parser.add_argument("--dialects", nargs="+", default=["sqlite", "postgres"],
                        choices=["sqlite", "postgres"])
    parser.add_argument("--provider", default="openai", choices=sorted(PROVIDERS))
    parser.add_argument("--polls", type=int, default=3)
    parser.add_argument("--poll-interval", type=float, default=10.0)
    parser.add_argument("--server", action="store_true",
                        help="start a PostgreSQL-backed Prefect server of this run's own")
    parser.add_argument("--server-nice", type=int, default=0,
                        help="CPU niceness of that server (0: same priority as the flows)")
    args = parser.parse_args()
    if args.subjects < 1 or args.polls < 0 or args.poll_interval < 0:
        parser.error("--subjects must be positive, --polls and --poll-interval not negative")
    if args.server:
        raise SystemExit(run_with_own_server(__file__, args.server_nice))
    prefect_environment()
    print(f"batch price bench: {args.subjects} subjects, {args.polls} polls answered in_progress "
          f"{args.poll_interval:g} s apart, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
          f"Prefect {os.environ.get('PREFECT_API_URL') or 'temporary server'}", flush=True)
    provider = PROVIDERS[args.provider]
    print(f"provider {provider.kind}: {provider.api} on loopback, model {provider.model}",
          flush=True)
    missed = 0
    with tempfile.TemporaryDirectory() as directory:
        for dialect in args.dialects:
            with ledger_url(dialect, Path(directory)) as url:
                if url is None:
                    print(f"{dialect}: PostgreSQL unreachable, skipped", flush=True)
                    continue
                missed += measure(dialect, url, provider, args)
    raise SystemExit(1 if missed else 0)


@dataclass
class Held:
    """Where the time went, in seconds: a worker was held for each flow run's wall time."""

    sync_tick: float = 0.0
    tick: float = 0.0  # the batch tick: register, claim, collect, queue the calls, submit
    waiting_polls: list[float] = field(default_factory=list)  # the batch still at work
    settling_polls: list[float] = field(default_factory=list)  # settled, Runs finished
    provider_at_work: float = 0.0  # the tick's end to the poll that found the batch ended
    done_at: float = 0.0  # the tick's start to the last Run completed

    @property
    def batch(self) -> float:
        return self.tick + sum(self.waiting_polls) + sum(self.settling_polls)


def measure(dialect: str, url: str, provider: Provider, args: argparse.Namespace) -> int:
    """One ledger's figures, printed; how many targets were missed."""
    from flows.run_job.flow import run_job
    from flows.run_job.outcomes import state_value
    from flows.settle.flow import SettleReport, settle_batches
    from store import Ledger

    with provider.server() as server:
        server.polls_until_done = args.polls
        os.environ.update({
            "RUNLEDGER_DATABASE_URL": url, "RUNLEDGER_MODEL": provider.kind,
            "RUNLEDGER_MODEL_BASE_URL": server.base_url, "RUNLEDGER_MODEL_NAME": provider.model,
            "RUNLEDGER_MODEL_API_KEY": provider.key, "RUNLEDGER_MODEL_CURRENCY": "USD",
            "RUNLEDGER_MODEL_PRICES": json.dumps(PRICES)})
        job = bench_job(args.subjects, [])
        ledger = Ledger.connect(url)
        held = Held()
        try:
            flow(settle_batches(return_state=True))  # Prefect's server started, imports done
            began = time.perf_counter()
            sync = flow(run_job(job.name, period=SYNC_PERIOD, batch=False, return_state=True))
            held.sync_tick = time.perf_counter() - began
            began = time.perf_counter()
            tick = flow(run_job(job.name, period=BATCH_PERIOD, batch=True, return_state=True))
            held.tick = time.perf_counter() - began
            ticked = time.perf_counter()
            print(f"{dialect:8} N={args.subjects}: synchronous tick {sync.name}, batch tick "
                  f"{tick.name}", flush=True)
            waiting = tick.name == "AwaitingBatch"
            while waiting and time.perf_counter() - began < 3600:
                time.sleep(args.poll_interval)  # no worker held: the provider works
                started = time.perf_counter()
                state = flow(settle_batches(return_state=True))
                took = time.perf_counter() - started
                report = state_value(state)
                if not isinstance(report, SettleReport):
                    raise SystemExit(f"settle-batches {state.name}: {state.message}")
                if report.reruns or any(p.action != "waiting" for p in report.polled):
                    if not held.settling_polls:
                        held.provider_at_work = started - ticked
                    held.settling_polls.append(took)
                else:
                    held.waiting_polls.append(took)
                waiting = bool(ledger.batches.waiting_runs(job.name)
                               or ledger.batches.released_runs())
            held.done_at = time.perf_counter() - began
            print(f"{dialect:8} N={args.subjects}: the batch tick's flow run ended "
                  f"{flow_run_state(tick.state_details.flow_run_id)}", flush=True)
            return report_figures(dialect, ledger, job.name, server, args.subjects, held)
        finally:
            ledger.close()


def flow(call: Any) -> State[Any]:
    """The final state of a flow called with ``return_state=True``."""
    return asyncio.run(cast("Coroutine[Any, Any, State[Any]]", call))


def flow_run_state(flow_run_id: Any) -> str:
    """The name of a flow run's state as the Prefect server has it now."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        found = client.read_flow_run(flow_run_id).state
    return "without a state" if found is None else str(found.name)


def report_figures(dialect: str, ledger: Ledger, job: str, server: Server, size: int,
                   held: Held) -> int:
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
    ratio = cost[BATCH_PERIOD] / cost[SYNC_PERIOD] if cost[SYNC_PERIOD] else float("nan")
    completed = sum(r.status == "completed" for r in runs.values())
    checks = {
        f"cost ratio batch : synchronous {ratio:.4f} (target {RATIO} +/- {TOLERANCE})":
            abs(ratio - RATIO) <= TOLERANCE,
        **created_once(ledger, server, 10 * size),
        f"answered calls per Run {sorted(set(answered.values()))} (target [1])":
            set(answered.values()) == {1} and len(answered) == 2 * size,
        f"Runs completed {completed} of {2 * size}": completed == 2 * size,
    }
    head = f"{dialect:8} N={size}:"
    waiting, settling = held.waiting_polls, held.settling_polls
    print(f"{head} synchronous tick: a worker held {held.sync_tick:.1f} s (the provider answers "
          "each call at once)", flush=True)
    print(f"{head} batch, a worker held: {held.tick:.1f} s by the tick that submits "
          f"({len(server.created)} batch(es)); {sum(waiting):.1f} s by {len(waiting)} poll(s) "
          f"while the provider worked{spread(waiting)}; {sum(settling):.1f} s by "
          f"{len(settling)} poll(s){spread(settling)} that "
          f"settled the answers and finished the Runs; {held.batch:.1f} s in all", flush=True)
    print(f"{head} batch, the provider at work {held.provider_at_work:.1f} s (the tick's end to "
          f"the poll that found its batch ended): a worker held {sum(waiting):.1f} s of it (the "
          f"polls), none for the other {held.provider_at_work - sum(waiting):.1f} s", flush=True)
    print(f"{head} batch, wall: the last Run completed {held.done_at:.1f} s after the tick "
          "started", flush=True)
    for text, met in checks.items():
        print(f"{head} {text}: {'met' if met else 'MISSED'}", flush=True)
    return sum(not met for met in checks.values())


def created_once(ledger: Ledger, server: Server, limit: int) -> dict[str, bool]:
    """Each batch created once, as the provider can tell: the check's text and whether met."""
    if isinstance(server, BatchServer):
        creates = set(server.creates_by_key.values())
        return {f"creates per batch key {sorted(creates)} (target [1])": creates == {1}}
    # Anthropic's batches carry no metadata, so no key to count creates by: a batch created
    # twice is a provider batch that no ledger batch names (or one named twice), and a call
    # sent twice is a custom_id in two provider batches.
    named = Counter(b.provider_batch_id for b in ledger.batches.list_batches(limit=limit))
    naming = {named[batch_id] for batch_id in server.created}
    sent = set(Counter(request["custom_id"] for batch in server.batches.values()
                       for request in batch.requests).values())
    return {f"ledger batches per provider batch {sorted(naming)}, provider batches per "
            f"custom_id {sorted(sent)} (target [1], [1])": naming == sent == {1}}


def spread(seconds: list[float]) -> str:
    """`` (A-B s each)`` for two or more flow runs' times, else nothing."""
    return f" ({min(seconds):.1f}-{max(seconds):.1f} s each)" if len(seconds) > 1 else ""


if __name__ == "__main__":
    main()
