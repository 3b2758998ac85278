"""The ``settle-batches`` flow: one poll of every due batch (``poll``), then the Runs each
settled batch released run again, one ``run-job`` subflow per job and period (named after the
tick, as a tick is): each transform replays its checkpointed answer and goes on, and a second
call goes into the next batch; Runs with a call withdrawn from batch mode (its deadline near)
run in a subflow of their own without batch mode, their calls sent synchronously. A tick's flow run, Paused as AwaitingBatch while its Runs wait,
is completed once none of them waits any more: its story ends when its Runs are settled.

A scheduled deployment rather than the tick's own flow run suspended and resumed: one path
whatever started the tick (a deployment, ``runledger run --batch``, a backfill), a poll that
any worker on any host may run, and Runs finished by a flow run whatever became of the tick's."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import defaultdict
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, cast

from prefect import State, flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run as current_flow_run
from prefect.states import Completed, Failed

from flows.batches.poll import Polled, poll_batches
from flows.events import emit_job_event
from flows.registry import get_job, registered_jobs
from flows.run_job.flow import run_job
from flows.run_job.outcomes import TickReport, state_value
from flows.run_job.stages import AWAITING_BATCH_STATE
from flows.settings import RunledgerSettings
from store import Ledger, ReleasedRun, Run, TickRef

log = logging.getLogger(__name__)


class SettleReport:
    """What one settle-batches flow run did: each batch it polled and each tick it ran again
    (a plain class: Prefect leaves it alone, see ``TickReport``)."""

    __slots__ = ("polled", "reruns")

    def __init__(self, polled: list[Polled], reruns: list[TickReport]) -> None:
        self.polled = polled
        self.reruns = reruns

    def summary(self) -> str:
        counts: dict[str, int] = defaultdict(int)
        for p in self.polled:
            counts[p.action] += 1
        batches = ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) or "none due"
        released = sum(len(p.released) for p in self.polled)
        failed = sum(len(p.failed) for p in self.polled)
        return (f"batches: {batches}; {released} Run(s) released, {failed} failed by the "
                f"provider; ticks run again: {', '.join(r.summary() for r in self.reruns) or 'none'}")


@flow(name="settle-batches", persist_result=False, log_prints=False)
async def settle_batches() -> State[Any]:
    """Poll every batch that is due: settle what ended, run the Runs batches released again
    (those of an earlier poll that died before it could, too), and complete the ticks none
    of whose Runs waits any more."""
    logger = get_run_logger()
    settings = RunledgerSettings()
    owner = f"{socket.gethostname()}:{os.getpid()}:{current_flow_run.id}"
    polled, pending = await asyncio.to_thread(_poll, settings, owner)
    # Every Run a batch released, by this poll or by one that died before running it again,
    # up to its job's attempts (reconcile gives up on the rest).
    released: dict[tuple[str, datetime, bool], list[Run]] = defaultdict(list)
    jobs = registered_jobs()
    for rel in pending:
        run = rel.run
        if run.job in jobs and run.attempts < jobs[run.job].max_attempts:
            released[(run.job, run.period_start, not rel.synchronous)].append(run)
    names = sorted({f"{job}/{get_job(job).period_at(start).label}"
                    for job, start, _ in released})
    if names:
        await _rename(f"settle-batches: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}")
    reruns: list[TickReport] = []
    rerun_states: dict[tuple[str, datetime], State[Any]] = {}
    for (job, start, batch), refs in sorted(released.items()):
        state = await cast("Coroutine[Any, Any, State[Any]]", run_job(
            job=job, subjects=sorted({r.subject for r in refs}), period=start.isoformat(),
            allow_not_due=True, batch=batch, return_state=True))
        # The tick's story follows the worse of its reruns (a paused or failed one).
        if (job, start) not in rerun_states or not state.is_completed():
            rerun_states[(job, start)] = state
        rerun = state_value(state)
        if isinstance(rerun, TickReport):
            reruns.append(rerun)
    for p in polled:
        if p.action == "settled" and p.job in jobs:
            emit_job_event("batch.settled", jobs[p.job], batch=p.key,
                           provider_batch_id=p.provider_batch_id,
                           provider_status=p.provider_status, settled=p.settled,
                           requeued=p.requeued, withdrawn=p.withdrawn, released=len(p.released),
                           failed=len(p.failed))
    await _end_settled_ticks(polled, rerun_states)
    report = SettleReport(polled, reruns)
    logger.info(report.summary())
    errors = [p for p in polled if p.action == "error"]
    if errors:
        return Failed(message=f"{report.summary()}; could not poll "
                              f"{'; '.join(f'{p.key}: {p.error}' for p in errors[:3])}",
                      data=report)
    return Completed(message=report.summary(), data=report)


def _poll(settings: RunledgerSettings, owner: str) -> tuple[list[Polled], list[ReleasedRun]]:
    """The due batches polled (deadlines judged by the database clock), then the Runs batches
    released that wait to run again."""
    ledger = Ledger.connect()
    try:
        return (poll_batches(ledger, settings, owner, ledger.now()),
                ledger.batches.released_runs())
    finally:
        ledger.close()


async def _rename(name: str) -> None:
    try:
        async with get_client() as client:
            await client.update_flow_run(current_flow_run.id, name=name)
    except Exception:  # monitoring: the poll's work is done whatever the name
        get_run_logger().warning("could not name the flow run %r", name, exc_info=True)


async def _end_settled_ticks(polled: list[Polled],
                             reruns: dict[tuple[str, datetime], State[Any]]) -> None:
    """End each tick flow run whose calls a settled batch held, that is still AwaitingBatch
    and none of whose calls still waits (the requeued calls of an expired batch keep it
    Paused), as its Runs' run again ended: Failed when that failed or the provider refused a
    Run's request, else Completed; still Paused when a further call of its Runs waits in a
    batch (that run-job flow run then carries the wait)."""
    ticks: dict[str, tuple[TickRef, list[Polled]]] = {}
    for p in polled:
        for tick in p.ticks if p.action == "settled" else []:
            ticks.setdefault(tick.flow_run_id, (tick, []))[1].append(p)
    if not ticks:
        return
    waiting = await asyncio.to_thread(_waiting_ticks)
    async with get_client() as client:
        for flow_run_id, (tick, by) in ticks.items():
            if flow_run_id in waiting:
                continue
            try:
                run = await client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
                if run.state is None or run.state.name != AWAITING_BATCH_STATE:
                    continue
                rerun = reruns.get((tick.job, tick.period_start))
                if rerun is not None and rerun.is_paused():
                    continue
                refused = sum(1 for p in by for ref in p.failed
                              if (ref.job, ref.period_start) == (tick.job, tick.period_start))
                told = f"its batch{'es' if len(by) > 1 else ''} settled" + (
                    "" if rerun is None else f"; its Runs ran again in run-job flow run "
                    f"{rerun.state_details.flow_run_id}: {rerun.message}") + (
                    "" if not refused else f"; {refused} Run(s) failed: the provider "
                    "refused their requests (`runledger runs show RUN`)")
                failed = bool(refused) or (rerun is not None and rerun.is_failed())
                await client.set_flow_run_state(
                    run.id, Failed(message=told) if failed else Completed(message=told),
                    force=True)
            except Exception:  # the ledger holds the Runs' truth; this is the UI's story
                get_run_logger().warning("could not complete tick flow run %s", flow_run_id,
                                         exc_info=True)


def _waiting_ticks() -> set[str]:
    """The tick flow runs that opened a batch not yet settled."""
    ledger = Ledger.connect()
    try:
        return ledger.batches.unsettled_flow_runs()
    finally:
        ledger.close()
