"""What a tick shows in Prefect's UI beside its states: the flow run's name and tags, and the
tick's Markdown artifact. Monitoring only: a refused API call is logged, never raised, because
failing a flow run whose tick the ledger completed would page someone for nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import State, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.runtime import flow_run as current_flow_run

from flows.jobs import Job
from flows.outcomes import TickReport

# A tick artifact's API call queues behind the server's backlog of the tick's task-run events
# (about half a second at 1,000 subjects), and so does the call that records the flow run's
# final state: the artifact is created concurrently with that call, and the flow run's end
# hook waits for it.
ARTIFACT_WAIT_SECONDS = 60.0
_artifacts: dict[str, asyncio.Task[None]] = {}


def tick_artifact_key(job: str) -> str:
    """The key of a job's tick artifact, one per flow run of ``run-job``."""
    return f"{job}-tick"


async def label_flow_run(name: str, job: Job | None) -> None:
    """Name the flow run ``{job}/{period}`` and tag it with the job and its version, in one API
    call; not its task runs: a tagged task run asks the server for tag concurrency slots, one
    round trip per task run."""
    labels = set() if job is None else {f"job:{job.name}", f"version:{job.version}"}
    try:
        async with get_client() as client:
            await client.update_flow_run(current_flow_run.id, name=name,
                                         tags=sorted({*current_flow_run.tags, *labels}))
    except Exception:
        get_run_logger().warning("could not name the flow run %r", name, exc_info=True)


def publish_artifact(flow_run_id: str, key: str, report: TickReport) -> None:
    """Start creating the tick's Markdown artifact; ``wait_for_tick_artifact`` awaits it."""
    async def create() -> None:
        try:
            await acreate_markdown_artifact(markdown=report.markdown(), key=key,
                                            description=report.summary())
        except Exception:  # the ledger already holds every outcome
            get_run_logger().warning("could not create the tick artifact %r", key, exc_info=True)

    _artifacts[flow_run_id] = asyncio.create_task(create(), name=f"tick-artifact-{flow_run_id}")


async def wait_for_tick_artifact(flow: Any, flow_run: FlowRun, state: State[Any]) -> None:
    """Flow run hook: a flow run that has ended has its tick artifact."""
    created = _artifacts.pop(str(flow_run.id), None)
    if created is not None:
        await asyncio.wait_for(created, ARTIFACT_WAIT_SECONDS)
