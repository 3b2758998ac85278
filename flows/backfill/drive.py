"""Driving a backfill's periods: oldest first, a few at once under the job's backfill limits,
each period a ``run-job`` subflow; its progress artifact, and a listener for each result."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.concurrency.asyncio import concurrency, rate_limit

from flows.backfill.limits import Limits
from flows.backfill.plan import PeriodPlan, Plan
from flows.backfill.report import BackfillReport, PeriodResult
from flows.jobs import Job
from flows.run_job.flow import run_job
from flows.run_job.outcomes import TickReport
from store import Ledger, RunledgerError

Listener = Callable[[PeriodResult], None]
_listener: ContextVar[Listener | None] = ContextVar("backfill_listener", default=None)


@contextmanager
def watching(listener: Listener) -> Iterator[None]:
    """Call ``listener`` with each period's result as it comes back, in this context (the
    CLI's progress bar for a backfill it runs in-process)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


async def drive(ledger: Ledger, planned: Plan, limits: Limits) -> BackfillReport:
    """Run the planned periods oldest first, ``max_active`` of them at once, each holding a
    slot of the job's backfill limit while its subflow runs; periods with nothing to run are
    reported at once. A cancelled backfill (Ctrl-C, a cancelled flow run) starts no further
    subflow: the waiting workers are cancelled with it, and the subflow under way releases
    its Runs (run-job's stop)."""
    report = BackfillReport(planned)
    listener = _listener.get()
    progress = _Progress(planned)
    await progress.start()
    queued = iter(planned.periods)

    async def worker() -> None:
        # A shared iterator: each worker takes the oldest period nobody took yet.
        for period in queued:
            result = await run_period(ledger, planned.job, period, limits,
                                      planned.request.allow_not_due)
            report.results.append(result)
            if listener is not None:
                listener(result)
            if result.flow_run_id is not None:
                await progress.update(report)

    try:
        # A TaskGroup, not gather: when one worker fails the others are cancelled, not left
        # starting subflows after the flow run ended.
        async with asyncio.TaskGroup() as workers:
            for _ in range(min(planned.request.max_active, len(planned.periods))):
                workers.create_task(worker())
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    report.results.sort(key=lambda r: r.planned.period.start)
    await progress.update(report, force=True)
    return report


async def run_period(ledger: Ledger, job: Job, planned: PeriodPlan,
                     limits: Limits, allow_not_due: bool = False) -> PeriodResult:
    """One period: nothing if it has nothing to run; else, holding a slot (and after the rate
    limit allows a start), requeue and unskip what reprocess asks, then its run-job subflow."""
    result = PeriodResult(planned)
    if not planned.run:
        return result
    async with concurrency(limits.active, occupy=1, strict=True):
        if limits.rate is not None:
            await rate_limit(limits.rate, occupy=1, strict=True)
        # Only now: a backfill stopped before this period leaves its failed Runs failed and
        # its skips recorded.
        if planned.requeue:
            await asyncio.to_thread(_requeue, ledger, planned.requeue)
        if planned.unskip:
            await asyncio.to_thread(ledger.occurrences.unskip, planned.unskip)
        state = await run_job(job=job.name, subjects=planned.run, period=planned.period.label,
                              allow_not_due=allow_not_due, return_state=True)
    result.flow_run_id = str(state.state_details.flow_run_id)
    value = await state.aresult(raise_on_failure=False)
    if isinstance(value, TickReport):
        result.tick = value
    else:
        result.error = str(value) if isinstance(value, BaseException) else state.message
    return result


def _requeue(ledger: Ledger, run_ids: Sequence[str]) -> None:
    for run_id in run_ids:
        # No longer failed (someone requeued or ran it since): run-job decides.
        with suppress(RunledgerError):
            ledger.requeue_run(run_id)


class _Progress:
    """The backfill's progress artifact in the UI (key ``backfill-<job>``). Monitoring only: a
    refused API call is logged, never raised."""

    def __init__(self, planned: Plan) -> None:
        self.planned = planned
        self.artifact: UUID | None = None
        self.loop_time = 0.0

    async def start(self) -> None:
        try:
            self.artifact = await acreate_progress_artifact(
                0.0, key=f"backfill-{self.planned.job.name}", description=self.planned.summary())
        except Exception:
            get_run_logger().warning("could not create the backfill progress artifact",
                                     exc_info=True)

    async def update(self, report: BackfillReport, force: bool = False) -> None:
        if self.artifact is None:
            return
        now = asyncio.get_running_loop().time()
        if not force and now - self.loop_time < 1.0:  # at most one call a second
            return
        self.loop_time = now
        done = sum(len(r.planned.run_ids) for r in report.results)
        try:
            await aupdate_progress_artifact(self.artifact, 100.0 * done / (self.planned.total or 1),
                                            description=report.summary())
        except Exception:
            get_run_logger().warning("could not update the backfill progress artifact",
                                     exc_info=True)
