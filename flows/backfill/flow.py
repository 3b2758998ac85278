"""The ``backfill`` flow: run a job's periods from one date to another on purpose, each period a
``run-job`` subflow with an explicit period (so never skipped for lateness), oldest first.

Resumable by construction: the range's Runs and skips are read in two queries before anything
runs, and a period whose every subject is completed (or left failed or skipped) starts no
subflow at all; the same backfill again runs only what is left. ``reprocess`` says what else
is run: ``failed`` Runs are requeued, ``skipped`` occurrences have their skip cleared, each
just before its period's subflow.

Throttling is Prefect's own (see ``configure_limits``): a global concurrency limit
``backfill-<job>`` holds ``max_active`` periods at once, a decaying one ``backfill-<job>:rate``
spaces their starts; both are shared by every backfill of the job and editable in the UI.

The package reads in that order: the parameters (``request``), the plan (``plan``, no I/O),
Prefect's limits (``limits``), driving the periods (``drive``) and the report (``report``)."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import State, flow, get_run_logger

from flows.backfill.drive import drive
from flows.backfill.limits import configure_limits
from flows.backfill.plan import read_plan
from flows.backfill.report import BackfillReport
from flows.backfill.request import Reprocess, check
from flows.run_job.monitoring import cancelled_if_interrupted
from flows.run_job.outcomes import listed_completed
from store import Ledger


@flow(name="backfill", flow_run_name="backfill/{job}/{start}..{end}", persist_result=False,
      log_prints=False, on_crashed=[cancelled_if_interrupted])
async def backfill(job: str, start: str, end: str, subjects: list[str] | None = None,
                   reprocess: Reprocess = "none", max_active: int = 2,
                   rate_per_minute: float | None = None, dry_run: bool = False,
                   allow_not_due: bool = False) -> State[Any]:
    """Run a job's periods from START to END, inclusive, oldest first, each as a run-job
    subflow; completed Runs are not run again, so the same backfill again resumes it.

    Args:
        job: Name of a registered job, e.g. competitor-summary.
        start: The first period: a date YYYY-MM-DD in the job's timezone, or an ISO datetime
            with an offset (the period containing it).
        end: The last period, the same way; at most 10,000 periods, none not yet due.
        subjects: Subjects to run, e.g. ["acme"]; leave empty for all of the job's subjects.
        reprocess: What else to run: none (failed Runs stay failed and skipped occurrences
            stay skipped), failed (requeue the failed Runs and run them) or skipped (clear the
            skips and run them).
        max_active: Periods running at once, across every backfill of this job (Prefect
            global concurrency limit backfill-JOB).
        rate_per_minute: At most this many periods started per minute (Prefect rate limit
            backfill-JOB:rate); leave empty for no rate limit.
        dry_run: Only report what would run; write nothing and run nothing.
        allow_not_due: Let END be a period not due yet (refused otherwise: a completed Run
            never changes, so early content would stay).
    """
    logger = get_run_logger()
    ledger = Ledger.open_existing()
    try:
        request = await asyncio.to_thread(
            check, job, start, end, subjects, reprocess, max_active, rate_per_minute,
            ledger.now(), allow_not_due)
        planned = await asyncio.to_thread(read_plan, ledger, request)
        if dry_run:
            logger.info(planned.summary())
            return listed_completed("DryRun", planned.summary(),
                                    BackfillReport(planned, dry_run=True))
        limits = await configure_limits(request)
        report = await drive(ledger, planned, limits)
    finally:
        ledger.close()
    logger.info(report.summary())
    return report.final_state()
