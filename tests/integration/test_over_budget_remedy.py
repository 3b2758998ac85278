"""An over-budget tick followed as a person would, on both ledgers: `runledger run` prints it
(table and JSON), its flow run is a Failed state named OverBudget whose short message prints
the remedy, and that remedy, run as printed once the cap is raised, completes every Run it left,
each with one paid call: for the latest period, and for a period before the one reconcile first
owed (a period run by hand), which reconcile used to pass over."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from typer.testing import Result

from flows import registry
from flows.jobs.budget import Budget
from tests.support import budget_probe
from tests.support.pipeline import Env, ModelServer, probe_job

N = 2
USAGE_TOKENS = budget_probe.CALL_TOKENS  # what the loopback server reports for every answer
REMEDY = re.compile(r"raise the cap \(the job's Budget\(per_period=\.\.\.\)\) and run `([^`]+)`")


@pytest.mark.parametrize("period", ["latest", "before-the-obligation"])
def test_the_remedy_an_over_budget_tick_prints_completes_its_runs_once_each(
        env: Env, model_server: ModelServer, invoke: Callable[..., Result],
        monkeypatch: pytest.MonkeyPatch, period: str) -> None:
    """3N subjects, room for N calls: `runledger run` prints N new and 2N over-budget in its
    table, and again as JSON; the flow run is Failed named OverBudget with the command once in
    its message; the cap raised, that command completes the 2N: 3N answered calls, one per
    Run. Answers of at most 16 tokens keep a call's bound below the call_estimate, so that N
    calls fit the cap exactly."""
    env.set(reconcile_backoff_seconds=0, model_max_tokens=16)
    budget = Budget(per_period=N * USAGE_TOKENS, unit="tokens", call_estimate=USAGE_TOKENS)
    probe = probe_job([f"s{i}" for i in range(3 * N)], budget=budget)
    # The stack's reconcile pass saw the job first: it owes from today's period on.
    assert invoke("reconcile", probe.name).exit_code == 0
    chosen = ([] if period == "latest" else
              ["--period", (env.ledger.now() - timedelta(days=1)).date().isoformat()])
    table = invoke("run", probe.name, *chosen, env={"COLUMNS": "120"})
    assert table.exit_code == 0, table.output
    assert f"{N} new, {2 * N} over-budget" in table.stdout
    # Again, as JSON: the refused Runs are refused again, before any call leaves.
    ran = invoke("run", probe.name, *chosen, "--json")
    assert ran.exit_code == 0, ran.output
    report = json.loads(ran.stdout)
    assert report["state"] == "OverBudget"
    assert Counter(s["outcome"] for s in report["subjects"]) == {"duplicate": N,
                                                                  "over-budget": 2 * N}
    assert len(model_server.requests) == N
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(report["flow_run_id"])).state
    assert state is not None and (state.type.value, state.name) == ("FAILED", "OverBudget")
    assert state.message is not None and state.message.count("runledger reconcile") == 1
    remedy = REMEDY.search(state.message)
    assert remedy is not None, state.message
    raised = dataclasses.replace(probe.job, budget=dataclasses.replace(
        budget, per_period=3 * N * USAGE_TOKENS))
    monkeypatch.setitem(registry._jobs, probe.name, raised)  # the job deployed with a new cap
    command = shlex.split(remedy[1])
    assert command[0] == "runledger"
    again = invoke(*command[1:])
    assert again.exit_code == 0, again.output
    runs = env.ledger.runs(job=probe.name)
    assert [r.status for r in runs] == ["completed"] * 3 * N
    calls = env.calls()
    assert len(model_server.requests) == len(calls) == 3 * N
    assert Counter(c["outcome"] for c in calls) == {"answered": 3 * N}
    assert Counter(c["subject"] for c in calls) == {f"s{i}": 1 for i in range(3 * N)}
