"""The ``reconcile`` flow: for each job, compare what it owes with the ledger and act, so that
every owed occurrence ends completed, skipped by its policy, or failed and reported.

One pass per job: record the subjects it owes (first time seen) and plan (``prepare.py``,
``plan.py``), record the policy's skips and the give-ups, report overdue occurrences, run the
missed and stranded ones as ``run-job`` subflows (oldest period first, a few at a time), then
report the recovered ones.
Overlapping passes are safe: the ledger decides each skip, give-up, report and claim once."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prefect import State, flow, get_run_logger
from prefect.artifacts import acreate_table_artifact
from prefect.states import Failed

from flows.board import Board
from flows.events import emit_decisions, emit_job_event
from flows.jobs import Job
from flows.occurrences.plan import ACTIONS, STATES, Plan, Step
from flows.occurrences.prepare import prepare
from flows.registry import get_job, registered_jobs
from flows.run_job.flow import run_job
from flows.run_job.monitoring import create_status_artifact, read_board
from flows.run_job.outcomes import TickReport, listed_completed
from flows.settings import RunledgerSettings
from store import Ledger, Occurrence


@dataclass
class JobReconciled:
    """What one pass did for one job: its plan and the ledger's answers to it."""

    plan: Plan
    skipped: list[str] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)
    overdue: list[str] = field(default_factory=list)
    recovered: list[Occurrence] = field(default_factory=list)
    holds_rejected: list[str] = field(default_factory=list)  # held messages past their deadline
    ticks: list[TickReport] = field(default_factory=list)
    dry_run: bool = False

    @property
    def job(self) -> Job:
        return self.plan.job

    def summary(self) -> str:
        states = Counter(s.state for s in self.plan.steps)
        parts = [f"{states[s]} {s}" for s in STATES if states[s]]
        acted = Counter(s.action for s in self.plan.steps)
        doing = [f"{acted[a]} {a}" for a in ACTIONS if a != "none" and acted[a]]
        text = f"{self.job.name}: {', '.join(parts) or 'nothing owed'}"
        if doing:
            text += f"; {'would ' if self.dry_run else ''}{', '.join(doing)}"
        if self.overdue:
            text += f"; {len(self.overdue)} newly overdue"
        if self.recovered:
            text += f"; {len(self.recovered)} recovered"
        if self.holds_rejected:
            text += f"; {len(self.holds_rejected)} held message(s) rejected by their deadline"
        if self.plan.capped:
            text += f"; {self.plan.capped} left for the next pass (cap)"
        return text

    def rows(self) -> list[dict[str, Any]]:
        return [{"job": self.job.name, "subject": s.owed.subject, "period": s.owed.period.label,
                 "state": s.state, "action": s.action, "overdue": s.overdue, "reason": s.reason,
                 "run_id": s.owed.identity.run_id} for s in self.plan.steps]

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job.name, "now": self.plan.now.isoformat(),
                "window_start": self.plan.window_start.isoformat(), "summary": self.summary(),
                "dry_run": self.dry_run, "capped": self.plan.capped, "occurrences": self.rows(),
                "skipped": self.skipped, "gave_up": self.gave_up, "overdue": self.overdue,
                "recovered": [o.run_id for o in self.recovered],
                "holds_rejected": self.holds_rejected,
                "ticks": [t.summary() for t in self.ticks]}


def _steps(planned: Plan) -> dict[str, Step]:
    return {s.owed.identity.run_id: s for s in planned.steps}


def decide(ledger: Ledger, planned: Plan) -> JobReconciled:
    """Record the plan's durable decisions before anything runs: the policy's skips, the
    give-ups, the overdue reports and the held messages the job's approval rejects at their
    deadline; then emit every decision's event not known emitted
    (these, and any a killed pass left)."""
    done = JobReconciled(planned)
    job = planned.job
    skips = planned.acting("skip")
    done.skipped = ledger.occurrences.skip([(s.owed.identity, s.reason) for s in skips])
    newly = set(done.skipped)
    for step in planned.acting("give-up"):
        assert step.run is not None
        if ledger.occurrences.give_up(step.run, job.max_attempts):
            done.gave_up.append(step.owed.identity.run_id)
    late = [s for s in planned.overdue() if s.owed.identity.run_id not in newly]
    done.overdue = ledger.occurrences.mark_overdue([s.owed.identity for s in late])
    approval = job.approval_now()
    if approval is not None and approval.on_deadline == "reject":
        done.holds_rejected = [m.message_id for m in ledger.outbox.reject_overdue_holds(job.name)]
    emit_decisions(ledger, job, _steps(planned))
    if planned.capped:
        emit_job_event("reconcile.capped", job, left=planned.capped,
                       message=f"{planned.capped} owed occurrences were left for the next pass")
    return done


def report_recovered(ledger: Ledger, done: JobReconciled) -> None:
    """Report the job's overdue occurrences that completed since, once each, and emit their
    events (and any other decision's not known emitted)."""
    done.recovered.extend(ledger.occurrences.mark_recovered(done.job.name))
    emit_decisions(ledger, done.job, _steps(done.plan))


async def drive(done: JobReconciled, concurrency: int) -> None:
    """Run the missed and stranded occurrences as ``run-job`` subflows, one per period with
    its subjects, oldest period first, at most ``concurrency`` at once."""
    by_period: dict[str, list[Step]] = defaultdict(list)
    for step in done.plan.acting("run", "redrive"):
        by_period[step.owed.period.label].append(step)
    gate = asyncio.Semaphore(concurrency)

    async def one(label: str, steps: list[Step]) -> None:
        async with gate:
            state = await run_job(job=done.job.name, subjects=[s.owed.subject for s in steps],
                                  period=label, return_state=True)
            value = await state.aresult(raise_on_failure=False)
            if isinstance(value, TickReport):
                done.ticks.append(value)

    await asyncio.gather(*(one(label, steps) for label, steps in by_period.items()))


async def reconcile_jobs(jobs: list[Job], *, dry_run: bool = False, now: datetime | None = None,
                         settings: RunledgerSettings | None = None) -> list[JobReconciled]:
    """One pass over ``jobs`` at ``now`` (default: the database clock, read per job): plan,
    decide and (unless ``dry_run``) drive each in turn."""
    settings = settings or RunledgerSettings()
    ledger = Ledger.open_existing()
    try:
        results = []
        for job in jobs:
            planned = await asyncio.to_thread(
                prepare, ledger, job, now, dry_run=dry_run, cap=settings.reconcile_cap,
                backoff=timedelta(seconds=settings.reconcile_backoff_seconds),
                max_backoff=timedelta(seconds=settings.reconcile_max_backoff_seconds))
            if dry_run:
                results.append(JobReconciled(planned, dry_run=True))
                continue
            done = await asyncio.to_thread(decide, ledger, planned)
            await drive(done, settings.reconcile_concurrency)
            await asyncio.to_thread(report_recovered, ledger, done)
            results.append(done)
        return results
    finally:
        ledger.close()


async def refresh_boards(jobs: list[Job]) -> None:
    """Create the next version of each job's status board artifact, as the pass left it."""
    def read(ledger: Ledger) -> list[Board | None]:
        return [read_board(ledger, job) for job in jobs]

    with Ledger.open_existing() as ledger:
        boards = await asyncio.to_thread(read, ledger)
    for board in boards:
        if board is not None:
            await create_status_artifact(board)


@flow(name="reconcile", persist_result=False, log_prints=False)
async def reconcile(job: str | None = None, dry_run: bool = False) -> State[Any]:
    """Compare what every job owes with the ledger and act: run missed occurrences as the job's
    missed-run policy says (or record them skipped), re-drive stranded Runs up to the job's
    attempt cap, report overdue and recovered occurrences. Overlapping runs are safe.

    Args:
        job: One registered job to reconcile; leave empty for every job.
        dry_run: Only report what would be done; write nothing and run nothing.
    """
    jobs = [get_job(job)] if job else list(registered_jobs().values())
    results = await reconcile_jobs(jobs, dry_run=dry_run)
    logger = get_run_logger()
    for result in results:
        logger.info(result.summary())
    rows = [row for result in results for row in result.rows() if row["state"] != "completed"]
    try:
        await acreate_table_artifact(
            table=rows or [{"job": "", "subject": "", "period": "", "state": "all completed",
                            "action": "", "overdue": False, "reason": "", "run_id": ""}],
            key="runledger-reconcile", description="; ".join(r.summary() for r in results))
    except Exception:  # monitoring only: the ledger holds every decision
        logger.warning("could not create the reconcile artifact", exc_info=True)
    await refresh_boards(jobs)
    message = "; ".join(r.summary() for r in results) or "no jobs"
    failed = [t for r in results for t in r.ticks if t.state_name() == "Failed"]
    if failed:
        return Failed(message=message, data=results)
    return listed_completed("DryRun" if dry_run else "Completed", message, results)
