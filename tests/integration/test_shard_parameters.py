"""The run-job flow's shard parameters outside a deployment: bad values are refused before
anything is written, and a flow run of no deployment runs its whole tick itself."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

from flows.run_job.flow import run_job
from flows.run_job.outcomes import TickReport
from tests.support.pipeline import Env, final_state

SUMMARY = "competitor-summary"


def run(**parameters: Any) -> Any:
    return final_state(run_job(job=SUMMARY, period="2026-01-05", return_state=True,
                               **parameters))


@pytest.mark.parametrize(("parameters", "message"), [
    ({"shard_size": 0}, "shard_size must be a whole number of subjects, 1 or more, got 0"),
    ({"shard": "3/2"}, "shard must be N/M \\(shard N of M\\), got '3/2'"),
])
def test_a_bad_shard_parameter_fails_the_flow_run_naming_the_fix_and_writes_nothing(
        env: Env, parameters: dict[str, Any], message: str) -> None:
    """No Run is registered, the state message says what to type, the name says invalid input."""
    state = run(**parameters)
    assert state.is_failed()
    assert env.ledger.runs() == []
    assert message.replace("\\", "") in (state.message or ""), state.message
    with get_client(sync_client=True) as client:
        name = client.read_flow_run(state.state_details.flow_run_id).name
    assert name == f"{SUMMARY}/invalid-input"


def test_a_flow_run_of_no_deployment_runs_every_subject_itself_whatever_its_shard_size(
        env: Env) -> None:
    """Shards are flow runs of the tick's deployment: with none, the tick is not split, and its
    two subjects complete in this flow run, one model call each."""
    state = run(shard_size=1)
    report = state.result()
    assert isinstance(report, TickReport)
    assert dict(report.counts()) == {"new": 2}
    assert env.model_calls() == 2
    parent = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(
        any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        assert client.read_flow_runs(flow_run_filter=parent) == []
