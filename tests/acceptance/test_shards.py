"""A tick spread over the work pool: a run-job flow run with ``shard_size`` 1 splits the
reference job's two subjects into two shard flow runs of its deployment, taken by the stack's
workers, and sums them; a shard whose process is SIGKILLed mid-transform leaves its Run to the
tick's retry, which completes it once."""

from __future__ import annotations

import os
import signal
from collections import Counter
from uuid import UUID

import pytest
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import FlowRun

from flows.jobs.competitor_summary import subscribers, workspaces
from flows.registry import get_job
from flows.run_job.monitoring import tick_artifact_key
from flows.run_job.outcomes import outcome_name
from tests.support.pipeline import lease_expired
from tests.support.stack import AcceptanceStack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]

SUMMARY = "competitor-summary"
JOB = get_job(SUMMARY)
SHARDED_PERIOD = "2026-03-02"
KILLED_PERIOD = "2026-03-03"


def run_id(subject: str, label: str) -> str:
    return JOB.identity(subject, JOB.parse_period(label)).run_id


def shards_of(stack: AcceptanceStack, parent: UUID) -> list[FlowRun]:
    """The shard flow runs the tick started, by name."""
    with stack.client() as api:
        found = api.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent])))
    return sorted(found, key=lambda r: r.name)


def test_a_sharded_tick_runs_each_shard_as_a_flow_run_of_its_deployment_and_sums_them(
        stack: AcceptanceStack) -> None:
    """Two shards named after the tick, each Completed with one Run it completed; the tick is
    Completed, its artifact counts both subjects new, and each Run made one model call."""
    parent = stack.run(SUMMARY, {"period": SHARDED_PERIOD, "shard_size": 1})
    final = stack.wait_final(parent, timeout=240)
    assert final.state is not None and outcome_name(final.state) == "Completed", final.state
    assert final.name == f"{SUMMARY}/{SHARDED_PERIOD}"
    shards = shards_of(stack, parent)
    assert [s.name for s in shards] == [f"{SUMMARY}/{SHARDED_PERIOD}/shard-{i}-of-2"
                                        for i in (1, 2)]
    assert [s.parameters["subjects"] for s in shards] == [[s] for s in workspaces()]
    assert all(s.deployment_id == final.deployment_id for s in shards)
    assert all(s.state is not None and s.state.is_completed() for s in shards)
    ids = [run_id(s, SHARDED_PERIOD) for s in workspaces()]
    with stack.ledger() as ledger:
        runs = ledger.get_many(ids)
    assert {runs[i].completed_flow_run_id for i in ids} == {str(s.id) for s in shards}
    assert Counter(c["run_id"] for c in stack.model_calls(set(ids))) == dict.fromkeys(ids, 1)
    with stack.client() as api:
        [artifact] = [a for a in api.read_artifacts(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[parent]))) if a.key == tick_artifact_key(SUMMARY)]
    assert artifact.description == f"{SUMMARY}/{SHARDED_PERIOD}: 2 new"
    assert all(i in str(artifact.data) for i in ids)


def test_a_shard_killed_mid_transform_fails_the_tick_and_its_retry_completes_the_run_once(
        stack: AcceptanceStack) -> None:
    """The shard of acme is SIGKILLed while its model call is under way: the worker reports it
    Crashed, the tick ends Failed naming the shard; once the dead attempt's lease expires, the
    tick's Retry completes acme (two attempts, two model calls: the killed one and the
    completing one) and finds globex completed by its shard."""
    parent = stack.run(SUMMARY, {"period": KILLED_PERIOD, "shard_size": 1})
    acme, globex = (run_id(s, KILLED_PERIOD) for s in workspaces())
    wait_until(lambda: stack.model_calls({acme}), 180, "acme's shard to call the model",
               every=0.1)
    [killed] = [s for s in shards_of(stack, parent) if s.parameters["subjects"] == ["acme"]]
    assert killed.infrastructure_pid is not None
    os.kill(int(killed.infrastructure_pid), signal.SIGKILL)
    final = stack.wait_final(parent, timeout=240)
    assert final.state is not None and final.state.is_failed(), final.state
    assert f"{killed.name} ended Crashed" in (final.state.message or "")
    with stack.ledger() as ledger:
        wait_until(lambda: lease_expired(ledger, acme), 60,
                   "the killed attempt's lease to expire")
    stack.retry(parent)
    retried = stack.wait_final(parent, timeout=240, run_count=2)
    assert retried.state is not None and outcome_name(retried.state) == "Completed", \
        retried.state
    with stack.ledger() as ledger:
        runs = ledger.get_many([acme, globex])
        attempts = Counter(a.outcome for a in ledger.attempts(acme))
    assert runs[acme].status == runs[globex].status == "completed"
    assert runs[acme].attempts == 2 and attempts["completed"] == 1
    calls = Counter(c["run_id"] for c in stack.model_calls({acme, globex}))
    assert calls == {acme: 2, globex: 1}
    with stack.ledger() as ledger:
        queued = sorted(m.recipient for m in ledger.outbox.messages(run_id=acme))
    assert queued == sorted(subscribers("acme"))  # one outbox row per recipient, once
