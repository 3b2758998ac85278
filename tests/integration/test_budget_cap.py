"""A budget is a cap, on both ledgers, against a priced server on loopback that bills every call
exactly the bound it reserved (prompt tokens as many as its bytes allow, completion tokens its
max_tokens): three worker processes of eight threads each with a cap of five calls spend at most
five calls' cost and the rest end over-budget without a call; the first call of a fresh process
holds the cap; a call_estimate below the bound is raised to it; the first burst of a tick takes
no more than the tokens-per-minute bucket holds; an answer billed beyond its bound is recorded,
emitted and shown by `runledger costs`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from typer.testing import CliRunner

from bench.limited_provider import Arrivals
from flows.cli import app
from flows.jobs import Job
from flows.prices import format_money
from flows.run_job.outcomes import outcome_name
from tests.support import cap_probe
from tests.support.cap_probe import BillingServer
from tests.support.pipeline import Env, outcomes, pipeline_env, wait_until

PROCESSES, THREADS, CAP_CALLS = 3, 8, 5


@pytest.fixture
def env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_api: str) -> Iterator[Env]:
    with pipeline_env(db_url, tmp_path, monkeypatch) as found:
        found.set(subject_concurrency=THREADS, **cap_probe.settings())
        yield found


def serving(env: Env, server: BillingServer) -> BillingServer:
    """The server, selected by RUNLEDGER_MODEL=openai for this process and its workers."""
    env.set(model="openai", model_base_url=server.base_url)
    return server


def yesterday(env: Env) -> str:
    return (env.ledger.now() - timedelta(days=1)).date().isoformat()


def run_workers(name: str, calls: float, period: str, groups: list[list[str]]
                ) -> list[dict[str, Any]]:
    """One `runledger run` process per group of subjects, started together; their reports."""
    environment = {**os.environ, cap_probe.ENV: name, cap_probe.CALLS: str(calls)}
    workers = [subprocess.Popen(
        [sys.executable, "-c", cap_probe.LOAD, "run", name, "--period", period,
         *(arg for s in group for arg in ("--subject", s)), "--json"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for group in groups]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-3000:]
        reports.append(json.loads(out))
    return reports


def per_process(reports: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each worker's subjects answered and over-budget."""
    counts = [Counter(s["outcome"] for s in r["subjects"]) for r in reports]
    return [(c["new"], c["over-budget"]) for c in counts]


def window_of(env: Env, job: Job, period: str) -> Any:
    [window] = env.ledger.calls.budget_windows(job.name, job.parse_period(period).start)
    return window


@pytest.mark.usefixtures("subprocesses_use_the_session_server")
@pytest.mark.processes
def test_three_processes_of_eight_threads_never_spend_past_a_cap_of_five_calls(
        env: Env) -> None:
    """24 subjects, 3 processes x 8 threads, every answer billed its whole bound: at most five
    calls answered, spent <= the cap (nothing left reserved), every other subject over-budget
    with no call made."""
    name = f"cap-probe-{uuid.uuid4().hex[:8]}"
    period = yesterday(env)
    cost = cap_probe.call_cost()
    groups = [cap_probe.SUBJECTS[i::PROCESSES] for i in range(PROCESSES)]
    with serving(env, BillingServer(delay=0.5)) as server:
        reports = run_workers(name, CAP_CALLS, period, groups)
    window = window_of(env, cap_probe.probe(name, CAP_CALLS), period)  # the workers' job
    calls = env.calls()
    seen = Counter(s["outcome"] for r in reports for s in r["subjects"])
    spent = sum(c["cost_nanos"] for c in calls)
    print(f"\ncap {format_money(window.cap, 'USD', 9)} ({CAP_CALLS} calls of "
          f"{format_money(cost, 'USD', 9)}); spent {format_money(window.spent, 'USD', 9)} "
          f"(calls' cost {format_money(spent, 'USD', 9)}); calls made {len(server.requests)}; "
          f"answered {seen['new']}; over-budget {seen['over-budget']} (refused by the budget "
          f"{window.refused}); per process (new, over-budget): {per_process(reports)}")
    assert window.cap == CAP_CALLS * cost
    assert len(server.requests) == len(calls) == seen["new"] <= CAP_CALLS
    assert all(c["outcome"] == "answered" and c["cost_nanos"] == c["estimate"] == cost
               for c in calls)
    assert spent == window.spent <= window.cap and window.reserved == 0
    assert seen == {"new": len(calls), "over-budget": len(cap_probe.SUBJECTS) - len(calls)}
    assert seen["new"] == CAP_CALLS  # each call costs its bound exactly: the cap fits five
    pending = [r for r in env.ledger.runs(job=name) if r.status == "pending"]
    assert len(pending) == seen["over-budget"] and all(r.attempts == 0 for r in pending)


@pytest.mark.usefixtures("subprocesses_use_the_session_server")
def test_a_cap_below_one_calls_bound_refuses_the_first_call_of_a_fresh_process(
        env: Env) -> None:
    """A cap of 0.9 of a call's bound: a new worker process's very first call is refused before
    it leaves; nothing is spent, nothing reserved."""
    name = f"cap-probe-{uuid.uuid4().hex[:8]}"
    period = yesterday(env)
    with serving(env, BillingServer()) as server:
        [report] = run_workers(name, 0.9, period, [cap_probe.SUBJECTS[:1]])
    assert report["state"] == "OverBudget" and report["subjects"][0]["outcome"] == "over-budget"
    assert server.requests == [] and env.calls() == []
    window = window_of(env, cap_probe.probe(name, 0.9), period)
    assert (window.spent, window.reserved, window.refused) == (0, 0, 1)


def test_a_call_estimate_below_the_bound_is_raised_to_the_bound(env: Env) -> None:
    """call_estimate of one billionth, a cap of two calls' bound, six subjects: each call
    reserves its bound all the same; two answered, spent exactly the cap, four over-budget."""
    name = f"cap-probe-{uuid.uuid4().hex[:8]}"
    job = cap_probe.probe(name, 2, call_estimate=Decimal("0.000000001"),
                          subjects=cap_probe.SUBJECTS[:6])
    with serving(env, BillingServer()) as server:
        state, report = env.run(name, None, yesterday(env))
    assert outcome_name(state) == "OverBudget", state
    assert Counter(outcomes(report).values()) == {"new": 2, "over-budget": 4}
    calls = env.calls()
    assert len(server.requests) == 2 and [c["estimate"] for c in calls] == [
        cap_probe.call_cost()] * 2
    window = window_of(env, job, yesterday(env))
    assert window.spent == window.cap == 2 * cap_probe.call_cost()


def test_a_first_burst_takes_no_more_than_the_tokens_per_minute_bucket(env: Env) -> None:
    """Tokens per minute worth three calls' bound a second, 16 subjects on 8 threads, answers
    billed their bound: the calls started in any one second (the ledger's clock) take at most
    the full bucket plus a second's refill, six calls' bound, not the 16 at once a ~10-token
    guess let through. A call's start is its transaction's time, which on a loaded machine
    can precede the moment its slot was taken: two calls of slack (a 2-core run under load
    counted 7)."""
    name = f"cap-probe-{uuid.uuid4().hex[:8]}"
    cap_probe.probe(name, 100, subjects=cap_probe.SUBJECTS[:16])
    bound_tokens = cap_probe.call_tokens()
    env.set(model_tokens_per_minute=3 * bound_tokens * 60)
    with serving(env, BillingServer(delay=0.2)) as server:
        state, report = env.run(name, None, yesterday(env))
    assert Counter(outcomes(report).values()) == {"new": 16}, state
    calls = env.calls()
    assert all(c["prompt_tokens"] + c["completion_tokens"] == bound_tokens for c in calls)
    started = Arrivals(accepted=[c["started_at"].timestamp() for c in calls])
    print(f"\nbucket {3 * bound_tokens} tokens ({3} calls' bound), refilled as much a second; "
          f"most calls started in any one second: {started.most_in_any_second()} of "
          f"{len(server.requests)}")
    assert started.most_in_any_second() <= 6 + 2


def overrun_events(job: str) -> list[dict[str, Any]]:
    with get_client(sync_client=True) as client:
        return [e.payload for e in client.read_events(EventFilter(
            event=EventNameFilter(name=["runledger.budget.overrun"]),
            resource=EventResourceFilter(id=[f"runledger.job.{job}"]),
        ), limit=50).events]


def test_an_answer_billed_beyond_its_bound_is_recorded_emitted_and_shown_by_costs(
        env: Env, cli: CliRunner) -> None:
    """A provider billing 10 completion tokens beyond max_tokens: the call records an overrun
    of 10, a runledger.budget.overrun event names it, and `costs` says so in a line."""
    name = f"cap-probe-{uuid.uuid4().hex[:8]}"
    cap_probe.probe(name, 10, subjects=cap_probe.SUBJECTS[:1])
    with serving(env, BillingServer(beyond=10)):
        state, report = env.run(name, None, yesterday(env))
    assert outcomes(report) == {"s00": "new"}, state
    [call] = env.calls()
    assert call["overrun"] == 10 and call["completion_tokens"] == cap_probe.MAX_TOKENS + 10
    wait_until(lambda: len(overrun_events(name)) >= 1, 60, "the overrun event")
    [event] = overrun_events(name)
    assert (event["call_id"], event["overrun_tokens"], event["max_tokens"]) == (
        call["call_id"], 10, cap_probe.MAX_TOKENS)
    shown = cli.invoke(app, ["costs", "--job", name], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert (f"{name}: 1 answer billed 10 tokens beyond their calls' bound"
            in " ".join(shown.output.split()))
