"""What a tick shows in Prefect's UI beside its states: the flow run's name and tags, the
tick's Markdown artifact and the job's status board (a table artifact). Monitoring only: a
refused API call is logged, never raised, because failing a flow run whose tick the ledger
completed would page someone for nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC
from typing import Any

from prefect import State, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.runtime import flow_run as current_flow_run
from prefect.states import Cancelled

from flows.board import Board, job_board
from flows.jobs import Job
from flows.run_job.outcomes import TickReport
from flows.run_job.stop import process_interrupted
from store import Ledger

# A tick artifact's API call queues behind the server's backlog of the tick's task-run events
# (about half a second at 1,000 subjects), and so does the call that records the flow run's
# final state: the artifacts are created concurrently with that call, and the flow run's end
# hook waits for them.
ARTIFACT_WAIT_SECONDS = 60.0
_artifacts: dict[str, list[asyncio.Task[None]]] = {}


def tick_artifact_key(job: str) -> str:
    """The key of a job's tick artifact, one per flow run of ``run-job``."""
    return f"{job}-tick"


def status_artifact_key(job: str) -> str:
    """The key of a job's status board artifact: one key per job (a job's name is lowercase
    letters, digits and dashes, as artifact keys must be), a new version per refresh."""
    return f"runledger-status-{job}"


def after_tick(ledger: Ledger, job: Job, report: TickReport) -> Board | None:
    """Add the tick's duplicates and in-progress-elsewhere findings to its job's counts for the
    UTC day (one statement, none when there are none) and what its duplicates would have cost
    (each one's answered calls' stored cost: one statement, none without duplicates), then read
    the job's status board as the tick left it. All are evidence about the tick, not its work,
    which is done: a failure is logged and gives no board."""
    try:
        now = ledger.now()
        day = now.astimezone(UTC).date()
        counts = report.counts()
        if counts["duplicate"] or counts["in-progress-elsewhere"]:
            ledger.count_suppressed(job.name, day, counts["duplicate"],
                                                counts["in-progress-elsewhere"])
        ledger.calls.count_saved(job.name, day, [s.run_id for s in report.subjects
                                                 if s.outcome == "duplicate"])
        return job_board(ledger, job, now)
    except Exception:
        get_run_logger().warning("could not count the duplicates of %r or read its status board",
                                 report.name, exc_info=True)
        return None


def read_board(ledger: Ledger, job: Job) -> Board | None:
    """The job's status board now, or None when the ledger could not give it (logged): the
    board is monitoring, and the pass it follows has done its work."""
    try:
        return job_board(ledger, job)
    except Exception:
        get_run_logger().warning("could not read the status board of %r", job.name,
                                 exc_info=True)
        return None


async def create_status_artifact(board: Board) -> None:
    """Create the next version of the job's status board table artifact; a refusal is logged."""
    key = status_artifact_key(board.job.name)
    try:
        await acreate_table_artifact(
            table=board.rows() or [{"job": board.job.name, "period": "no period owed yet"}],
            key=key, description=board.summary())
    except Exception:  # the ledger holds every fact the board shows
        get_run_logger().warning("could not create the status artifact %r", key, exc_info=True)


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


def publish_artifacts(flow_run_id: str, key: str, report: TickReport,
                      board: Board | None) -> None:
    """Start creating the tick's Markdown artifact and, if given, the job's status board;
    ``wait_for_tick_artifacts`` awaits them."""
    async def create() -> None:
        try:
            await acreate_markdown_artifact(markdown=report.markdown(), key=key,
                                            description=report.summary())
        except Exception:  # the ledger already holds every outcome
            get_run_logger().warning("could not create the tick artifact %r", key, exc_info=True)

    started = [asyncio.create_task(create(), name=f"tick-artifact-{flow_run_id}")]
    if board is not None:
        started.append(asyncio.create_task(create_status_artifact(board),
                                           name=f"status-artifact-{flow_run_id}"))
    _artifacts[flow_run_id] = started


INTERRUPTED_MESSAGE = ("stopped by Ctrl-C in the terminal that ran it: subjects at a stage "
                       "finished it and completed, the others were released (pending) for a "
                       "later run")


async def cancelled_if_interrupted(flow: Any, flow_run: FlowRun, state: State[Any]) -> None:
    """Flow run hook on Crashed: a flow run its own process stopped on Ctrl-C ends Cancelled,
    as a person cancelled it (Prefect reports the stopped task as a crash)."""
    if not process_interrupted():
        return
    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, Cancelled(message=INTERRUPTED_MESSAGE),
                                        force=True)


async def wait_for_tick_artifacts(flow: Any, flow_run: FlowRun, state: State[Any]) -> None:
    """Flow run hook: a flow run that has ended has its tick artifact and status board."""
    created = _artifacts.pop(str(flow_run.id), [])
    if created:
        await asyncio.wait_for(asyncio.gather(*created), ARTIFACT_WAIT_SECONDS)
