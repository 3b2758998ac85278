"""A job's budget through the real run-job flow against an OpenAI-compatible server on loopback,
on both ledgers: a budget of N calls lets exactly N subjects call, the others end over-budget
(no call, no failure, their Runs owed), the flow run is Failed named OverBudget and says how to go on,
one runledger.budget.exhausted event is emitted; once the cap is raised, reconcile finishes
them, once each. Two worker processes ticking one job's period at once share its budget and
never spend past its cap together. A budget in money on a model without a price is refused,
nothing written."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
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

from flows import registry
from flows.jobs.budget import Budget
from flows.reconcile.flow import reconcile_jobs
from flows.run_job.outcomes import outcome_name
from flows.settings import RunledgerSettings
from tests.support import budget_probe
from tests.support.pipeline import (
    Env,
    ModelServer,
    Reply,
    outcomes,
    pipeline_env,
    probe_job,
    wait_until,
)

N = 2
USAGE_TOKENS = budget_probe.CALL_TOKENS  # what the loopback server reports for every answer


@pytest.fixture
def env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_api: str) -> Iterator[Env]:
    """A fresh ledger, fast retries and no re-drive backoff; answers of at most 16 tokens, so
    that a call's bound stays below the call_estimate of what the server bills (the estimate
    a call reserves, the bound being lower: N calls fit the cap exactly)."""
    with pipeline_env(db_url, tmp_path, monkeypatch) as found:
        found.set(reconcile_backoff_seconds=0, model_max_tokens=16)
        yield found


def exhausted_events(job: str) -> int:
    with get_client(sync_client=True) as client:
        return len(client.read_events(EventFilter(
            event=EventNameFilter(name=["runledger.budget.exhausted"]),
            resource=EventResourceFilter(id=[f"runledger.job.{job}"]),
        ), limit=50).events)


def test_a_budget_of_n_calls_lets_exactly_n_subjects_call_and_reconcile_finishes_the_rest(
        env: Env, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """3N subjects, room for N calls: N completed, 2N over-budget with no call; one exhausted
    event; the cap raised, reconcile completes the 2N once each: 3N calls in all."""
    budget = Budget(per_period=N * USAGE_TOKENS, unit="tokens", call_estimate=USAGE_TOKENS)
    probe = probe_job([f"s{i}" for i in range(3 * N)], budget=budget)
    now = env.ledger.now()
    period = (now - timedelta(days=1)).date().isoformat()  # owed, inside the catch-up window
    state, report = env.run(probe.name, None, period)
    assert state.is_failed() and state.name == outcome_name(state) == "OverBudget", state
    assert "raise the cap" in (state.message or "")
    assert Counter(outcomes(report).values()) == {"new": N, "over-budget": 2 * N}
    assert len(model_server.requests) == N == env.model_calls()
    waiting = [r for r in env.ledger.runs(job=probe.name) if r.status == "pending"]
    assert len(waiting) == 2 * N and all(r.attempts == 0 for r in waiting)
    wait_until(lambda: exhausted_events(probe.name) >= 1, 60, "the exhausted event")
    assert exhausted_events(probe.name) == 1
    raised = dataclasses.replace(probe.job, budget=dataclasses.replace(
        budget, per_period=3 * N * USAGE_TOKENS))
    monkeypatch.setitem(registry._jobs, probe.name, raised)  # the job deployed with a new cap
    asyncio.run(reconcile_jobs([raised], now=env.ledger.now(), settings=RunledgerSettings()))
    runs = env.ledger.runs(job=probe.name)
    assert [r.status for r in runs] == ["completed"] * 3 * N
    assert len(model_server.requests) == 3 * N == env.model_calls()


@pytest.mark.usefixtures("subprocesses_use_the_session_server")
@pytest.mark.processes
def test_two_worker_processes_sharing_a_budget_never_spend_past_its_cap_together(
        env: Env, model_server: ModelServer) -> None:
    """Two `runledger run` processes at once, each with half of 3N subjects of one job's period
    and its budget of N calls (slow answers, so that their calls overlap): the ledger holds N
    answered calls whose tokens stay within the cap, the window spent no more than its cap with
    nothing left reserved, 2N subjects over-budget (none failed), their Runs pending and owed,
    and one exhausted event."""
    name = f"budget-probe-{uuid.uuid4().hex[:8]}"
    env.monkeypatch.setenv(budget_probe.ENV, name)
    env.monkeypatch.setenv(budget_probe.CALLS, str(N))
    job = budget_probe.probe(name, N)
    model_server.script.extend(Reply(delay=0.3) for _ in range(3 * N))
    period = job.parse_period((env.ledger.now() - timedelta(days=1)).date().isoformat())
    subjects = job.subject_names()
    halves = [subjects[:len(subjects) // 2], subjects[len(subjects) // 2:]]
    workers = [subprocess.Popen(
        [sys.executable, "-c", budget_probe.LOAD, "run", name, "--period", period.label,
         *(arg for s in half for arg in ("--subject", s)), "--json"],
        env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for half in halves]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
        reports.append(json.loads(out))
    assert [r["state"] for r in reports] == ["OverBudget", "OverBudget"]
    assert Counter(s["outcome"] for r in reports for s in r["subjects"]) == {
        "new": N, "over-budget": 2 * N}
    calls = env.calls()
    assert [c["outcome"] for c in calls] == ["answered"] * N == ["answered"] * len(
        model_server.requests)
    assert sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls) <= N * USAGE_TOKENS
    [window] = env.ledger.calls.budget_windows(name, period.start)
    assert (window.scope, window.cap, window.reserved) == ("period", N * USAGE_TOKENS, 0)
    assert window.spent <= window.cap and (window.calls, window.refused) == (N, 2 * N)
    runs = env.ledger.runs(job=name)
    assert Counter(r.status for r in runs) == {"completed": N, "pending": 2 * N}
    assert all(r.attempts == 0 and "over budget" in (r.error or "")
               for r in runs if r.status == "pending")
    wait_until(lambda: exhausted_events(name) >= 1, 60, "the exhausted event")
    assert exhausted_events(name) == 1


def test_a_budget_in_money_on_a_model_without_a_price_is_refused_and_writes_nothing(
        env: Env, model_server: ModelServer) -> None:
    """No price for probe-model: the flow run fails naming the settings; no Run is written."""
    probe = probe_job(["s0"], budget=Budget(per_period="1.00"))
    state, _ = env.run(probe.name, None, "2026-02-02")
    assert state.is_failed() and "has no price" in (state.message or "")
    assert env.ledger.runs(job=probe.name) == [] and model_server.requests == []
