"""The review-outbox flow run as a person meets it in the Prefect UI: started in a subprocess
against the session's server, found once it is Paused, its form read, and resumed with a
filled form through the API the UI uses (``resume_flow_run`` with the input)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter
from prefect.client.schemas.objects import FlowRun

from flows.review.flow import review_outbox
from tests.support.delivery import RUNLEDGER
from tests.support.waiting import wait_until

PAUSE_SECONDS = 120  # a cold flow run in a subprocess on a loaded machine


def stop(process: subprocess.Popen[str], timeout: float = PAUSE_SECONDS) -> str:
    """The review process's output once it ended (killed if it still runs after ``timeout``)."""
    try:
        return process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[0]


def start_review(env: dict[str, str], **parameters: Any) -> subprocess.Popen[str]:
    """`review_outbox(**parameters)` in a process of its own (as a worker would run it)."""
    code = ("import json, sys; from flows.review.flow import review_outbox; "
            "review_outbox(**json.loads(sys.argv[1]))")
    return subprocess.Popen([RUNLEDGER[0], "-c", code, json.dumps(parameters)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


async def _review_runs() -> list[FlowRun]:
    async with get_client() as client:
        return await client.read_flow_runs(flow_filter=FlowFilter(
            name=FlowFilterName(any_=["review-outbox"])), flow_run_filter=FlowRunFilter())


async def review_deployment() -> None:
    """The review-outbox deployment on the session's server (no worker runs it: its flow runs
    stay scheduled), as `prefect deploy` would make it."""
    deployment = await review_outbox.ato_deployment(name="review-outbox")
    await deployment.apply()  # type: ignore[misc]  # the async dispatch


async def review_flow_runs() -> list[FlowRun]:
    """Every flow run of the review-outbox flow on the session's server."""
    return await _review_runs()


def paused_review(known: set[UUID]) -> FlowRun:
    """The review-outbox flow run not in ``known`` once it is Paused, waiting for its input."""
    def paused() -> FlowRun | None:
        found = [r for r in asyncio.run(_review_runs()) if r.id not in known
                 and r.state is not None and r.state.is_paused()]
        return found[0] if found else None
    return wait_until(paused, PAUSE_SECONDS, "a paused review-outbox flow run")


def review_run_ids() -> set[UUID]:
    return {r.id for r in asyncio.run(_review_runs())}


def form_schema(run: FlowRun) -> dict[str, Any]:
    """The JSON schema of the form the paused run shows (what the UI renders)."""
    assert run.state is not None and run.state.state_details.run_input_keyset is not None
    key = run.state.state_details.run_input_keyset["schema"]

    async def read() -> Any:
        async with get_client() as client:
            return await client.read_flow_run_input(run.id, key)
    return json.loads(asyncio.run(read()))  # type: ignore[no-any-return]


def resume(run: FlowRun, answer: dict[str, Any]) -> None:
    """What the UI's Resume button sends: the filled form as the run's input."""
    async def send() -> None:
        async with get_client() as client:
            result = await client.resume_flow_run(run.id, run_input=answer)
            assert result.status.value == "ACCEPT", result
    asyncio.run(send())


def final_state(run: FlowRun, timeout: float = PAUSE_SECONDS) -> Any:
    async def read() -> Any:
        async with get_client() as client:
            return (await client.read_flow_run(run.id)).state
    return wait_until(lambda: (s := asyncio.run(read())) is not None and s.is_final() and s,
                      timeout, f"flow run {run.id} to end")
