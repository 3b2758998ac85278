"""The run-job flow's sharding outside a deployment: a bad ``shard_size`` or shard label is
refused before anything is written, and a flow run of no deployment runs its whole tick
itself."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import FlowRunCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.flow_engine import run_flow
from prefect.states import Pending, to_state_create

from flows.run_job.flow import run_job
from flows.run_job.outcomes import TickReport
from flows.run_job.shards import shard_key
from tests.support.pipeline import Env, final_state

SUMMARY = "competitor-summary"


def run(**parameters: Any) -> Any:
    return final_state(run_job(job=SUMMARY, period="2026-01-05", return_state=True,
                               **parameters))


def run_keyed(idempotency_key: str, **more: Any) -> Any:
    """A flow run created with ``idempotency_key``, as a sharded tick creates its shards."""
    parameters = {"job": SUMMARY, "period": "2026-01-05", **more}
    with get_client(sync_client=True) as client:
        # The client's create_flow_run takes no key: the API's, as run_deployment calls it.
        flow_id = client.create_flow(run_job)
        created = client.request("POST", "/flow_runs/", json=FlowRunCreate(
            flow_id=flow_id, parameters=parameters, idempotency_key=idempotency_key,
            state=to_state_create(Pending())).model_dump(mode="json", exclude_unset=True))
        flow_run = FlowRun.model_validate(created.json())
    # Prefect types run_flow for a sync flow; this async one's call is the coroutine it runs.
    engine: Any = run_flow
    return final_state(engine(run_job, flow_run=flow_run, parameters=parameters,
                              return_type="state"))


@pytest.mark.parametrize(("parameters", "message"), [
    ({"shard_size": 0}, "shard_size must be a whole number of subjects, 1 or more, got 0"),
    ({"idempotency_key": shard_key("tick:1", "3/2")},
     "shard must be N/M \\(shard N of M\\), got '3/2'"),
])
def test_a_bad_shard_parameter_fails_the_flow_run_naming_the_fix_and_writes_nothing(
        env: Env, parameters: dict[str, Any], message: str) -> None:
    """No Run is registered, the state message says what to type, the name says invalid input;
    a shard's label, which only a sharded tick writes (in the shard's idempotency key), too."""
    state = (run_keyed(parameters["idempotency_key"]) if "idempotency_key" in parameters
             else run(**parameters))
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


def test_a_flow_run_keyed_as_a_shard_is_named_after_its_shard_and_runs_its_subjects(
        env: Env) -> None:
    """The label in the idempotency key a sharded tick gives its shard names the flow run
    ``{job}/{period}/shard-N-of-M``; the shard runs its subjects, one model call each."""
    state = run_keyed(shard_key("tick:1", "2/3"), subjects=["acme"])
    assert state.is_completed(), state.message
    assert dict(state.result().counts()) == {"new": 1}
    assert env.model_calls() == 1
    with get_client(sync_client=True) as client:
        name = client.read_flow_run(state.state_details.flow_run_id).name
    assert name == f"{SUMMARY}/2026-01-05/shard-2-of-3"
