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

This module reads top-down: the flow, the parameters' checks, the plan (no I/O), the limits,
then driving the periods."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args
from uuid import UUID

from prefect import State, flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
)
from prefect.concurrency.asyncio import concurrency, rate_limit
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.states import Completed, Failed

from flows.jobs import Job, get_job
from flows.outcomes import TickReport
from flows.pipeline import run_job
from store import InvalidInput, Ledger, Occurrence, Period, RunledgerError, RunState

Reprocess = Literal["none", "failed", "skipped"]
REPROCESS: tuple[Reprocess, ...] = get_args(Reprocess)
MAX_PERIODS = 10_000
# What each (subject, period) of a backfill came to: a run-job outcome, or, for those the plan
# left alone, "duplicate" (completed before), "failed" (failed before) or "skipped".
COUNTED = ("new", "duplicate", "failed", "skipped", "stopped", "in-progress-elsewhere",
           "lease-lost")


class InvalidBackfill(InvalidInput):
    """A backfill's parameters are invalid; nothing was run or written."""


@flow(name="backfill", flow_run_name="backfill/{job}/{start}..{end}", persist_result=False,
      log_prints=False)
async def backfill(job: str, start: str, end: str, subjects: list[str] | None = None,
                   reprocess: Reprocess = "none", max_active: int = 2,
                   rate_per_minute: float | None = None, dry_run: bool = False) -> State[Any]:
    """Run a job's periods from START to END, inclusive, oldest first, each as a run-job
    subflow; completed Runs are not run again, so the same backfill again resumes it.

    Args:
        job: Name of a registered job, e.g. competitor-summary.
        start: The first period: a date YYYY-MM-DD in the job's timezone, or an ISO datetime
            with an offset (the period containing it).
        end: The last period, the same way; at most 10,000 periods, none in the future.
        subjects: Subjects to run, e.g. ["acme"]; leave empty for all of the job's subjects.
        reprocess: What else to run: none (failed Runs stay failed and skipped occurrences
            stay skipped), failed (requeue the failed Runs and run them) or skipped (clear the
            skips and run them).
        max_active: Periods running at once, across every backfill of this job (Prefect
            global concurrency limit backfill-JOB).
        rate_per_minute: At most this many periods started per minute (Prefect rate limit
            backfill-JOB:rate); leave empty for no rate limit.
        dry_run: Only report what would run; write nothing and run nothing.
    """
    logger = get_run_logger()
    ledger = Ledger.connect()
    try:
        request = await asyncio.to_thread(
            check, job, start, end, subjects, reprocess, max_active, rate_per_minute,
            ledger.now())
        planned = await asyncio.to_thread(read_plan, ledger, request)
        if dry_run:
            logger.info(planned.summary())
            return Completed(name="DryRun", message=planned.summary(),
                             data=BackfillReport(planned, dry_run=True))
        limits = await configure_limits(request)
        report = await drive(ledger, planned, limits)
    finally:
        ledger.close()
    logger.info(report.summary())
    return report.final_state()


# --- the parameters -------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """A backfill's checked parameters: the job, its periods oldest first, and how to run."""

    job: Job
    periods: list[Period]
    subjects: list[str]
    reprocess: Reprocess = "none"
    max_active: int = 2
    rate_per_minute: float | None = None


def check(job: str | Job, start: str, end: str, subjects: Sequence[str] | None,
          reprocess: str, max_active: int, rate_per_minute: float | None,
          now: datetime) -> Request:
    """The checked parameters, or an error naming what is wrong and how to fix it; ``now``
    (the database clock) decides which periods have started."""
    definition = get_job(job) if isinstance(job, str) else job
    if reprocess not in REPROCESS:
        raise InvalidBackfill(f"reprocess must be one of {', '.join(REPROCESS)}, "
                              f"got {reprocess!r}")
    if isinstance(max_active, bool) or not isinstance(max_active, int) or max_active < 1:
        raise InvalidBackfill(f"max_active must be a whole number of 1 or more, "
                              f"got {max_active!r}")
    if rate_per_minute is not None and not rate_per_minute > 0:
        raise InvalidBackfill(f"the rate must be more than 0 periods a minute, got "
                              f"{rate_per_minute!r}; leave it out for no rate limit")
    chosen = definition.resolve_subjects(subjects)
    return Request(definition, periods_between(definition, start, end, now), chosen,
                   reprocess, max_active, rate_per_minute)


def periods_between(job: Job, start: str, end: str, now: datetime,
                    limit: int = MAX_PERIODS) -> list[Period]:
    """The job's periods from the one containing ``start`` to the one containing ``end``,
    inclusive, oldest first: at most ``limit``, none that starts after ``now``."""
    first, last = job.parse_period(start), job.parse_period(end)
    if last.start < first.start:
        raise InvalidBackfill(f"end {_named(end, last)} is before start {_named(start, first)}: "
                              f"the start (--from) must be the earlier period")
    current = job.period_at(now)
    if last.start > current.start:
        raise InvalidBackfill(f"end {_named(end, last)} has not started yet: a backfill runs "
                              f"past periods, up to the current one ({current.label})")
    periods = [first]
    while periods[-1].start < last.start:
        if len(periods) == limit:
            raise InvalidBackfill(f"{first.label}..{last.label} is more than {limit} periods "
                                  f"of job {job.name} ({job.cadence}); split it into "
                                  f"smaller ranges")
        periods.append(job.period_at(periods[-1].end))
    return periods


def _named(text: str, period: Period) -> str:
    return text if text.strip() == period.label else f"{text} (period {period.label})"


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*min)?\s*$")


def parse_rate(text: str) -> float:
    """``10/min`` (or ``10``) as periods per minute."""
    found = _RATE.match(text)
    if found is None or not float(found.group(1)) > 0:
        raise InvalidBackfill(f"--rate must be a number of periods per minute such as 10/min, "
                              f"got {text!r}")
    return float(found.group(1))


# --- the plan (no I/O) ----------------------------------------------------------------------

@dataclass(frozen=True)
class PeriodPlan:
    """One period of a backfill: the subjects its subflow runs, and those it leaves alone."""

    period: Period
    run: list[str]
    completed: list[str]
    failed: list[str]
    skipped: list[str]
    run_ids: dict[str, str]
    requeue: list[str] = field(default_factory=list)  # failed Runs to requeue before the run
    unskip: list[str] = field(default_factory=list)   # skips to clear before the run

    def row(self) -> dict[str, Any]:
        return {"period": self.period.label, "run": self.run, "completed": self.completed,
                "failed": self.failed, "skipped": self.skipped, "requeue": len(self.requeue),
                "unskip": len(self.unskip)}


@dataclass(frozen=True)
class Plan:
    """What a backfill runs, period by period, oldest first."""

    request: Request
    periods: list[PeriodPlan]

    @property
    def job(self) -> Job:
        return self.request.job

    @property
    def total(self) -> int:
        """Every (period, subject) of the backfill."""
        return len(self.periods) * len(self.request.subjects)

    @property
    def label(self) -> str:
        periods = self.request.periods
        return f"{self.job.name} {periods[0].label}..{periods[-1].label}"

    def summary(self) -> str:
        runs = sum(len(p.run) for p in self.periods)
        parts = [f"{runs} to run"]
        for name in ("completed", "failed", "skipped"):
            count = sum(len(getattr(p, name)) for p in self.periods)
            if count:
                parts.append(f"{count} {name}")
        requeue = sum(len(p.requeue) for p in self.periods)
        unskip = sum(len(p.unskip) for p in self.periods)
        if requeue:
            parts.append(f"{requeue} failed requeued first")
        if unskip:
            parts.append(f"{unskip} skips cleared first")
        return (f"backfill {self.label} ({len(self.periods)} periods x "
                f"{len(self.request.subjects)} subjects): {', '.join(parts)}")


def plan(request: Request, runs: Mapping[str, RunState],
         occurrences: Mapping[str, Occurrence]) -> Plan:
    """Where each (period, subject) stands and whether the backfill runs it: a completed Run
    never; a failed Run only with reprocess=failed (requeued first); an occurrence skipped by
    policy (and never run) only with reprocess=skipped (its skip cleared first); any other
    (no Run, or one pending or running) always, and run-job decides who finishes it."""
    job = request.job
    planned: list[PeriodPlan] = []
    for period in request.periods:
        run_ids = {s: job.identity(s, period).run_id for s in request.subjects}
        to_run: list[str] = []
        completed: list[str] = []
        failed: list[str] = []
        skipped: list[str] = []
        requeue: list[str] = []
        unskip: list[str] = []
        for subject, run_id in run_ids.items():
            run = runs.get(run_id)
            occurrence = occurrences.get(run_id)
            if run is not None and run.status == "completed":
                completed.append(subject)
            elif run is not None and run.status == "failed":
                if request.reprocess == "failed":
                    requeue.append(run_id)
                    to_run.append(subject)
                else:
                    failed.append(subject)
            elif run is None and occurrence is not None and occurrence.skipped_at is not None:
                if request.reprocess == "skipped":
                    unskip.append(run_id)
                    to_run.append(subject)
                else:
                    skipped.append(subject)
            else:
                to_run.append(subject)
        planned.append(PeriodPlan(period, to_run, completed, failed, skipped, run_ids,
                                  requeue, unskip))
    return Plan(request, planned)


def read_plan(ledger: Ledger, request: Request) -> Plan:
    """The plan from the range's Runs and recorded occurrences (two queries, from the first
    period on; only those of the range's identities count)."""
    since = request.periods[0].start
    wanted = {run_id for period in request.periods for run_id in
              (request.job.identity(s, period).run_id for s in request.subjects)}
    runs = {r.run_id: r for r in ledger.run_states(request.job.name, since)
            if r.run_id in wanted}
    occurrences = {o.run_id: o for o in ledger.occurrences(request.job.name, since)
                   if o.run_id in wanted}
    return plan(request, runs, occurrences)


# --- what came of it ------------------------------------------------------------------------

@dataclass
class PeriodResult:
    """One period's plan and what its run-job subflow reported (none if nothing was run)."""

    planned: PeriodPlan
    tick: TickReport | None = None
    flow_run_id: str | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return self.planned.period.label

    def outcomes(self) -> dict[str, str]:
        """Each subject's outcome: the subflow's, or the plan's for those it left alone."""
        found: dict[str, str] = dict.fromkeys(self.planned.completed, "duplicate")
        found.update(dict.fromkeys(self.planned.failed, "failed"))
        found.update(dict.fromkeys(self.planned.skipped, "skipped"))
        if self.tick is not None:
            found.update({s.subject: s.outcome for s in self.tick.subjects})
        elif self.error is not None:
            found.update(dict.fromkeys(self.planned.run, "failed"))
        return found

    def counts(self) -> Counter[str]:
        return Counter(self.outcomes().values())

    def as_dict(self) -> dict[str, Any]:
        outcomes = self.outcomes()
        return {"period": self.label, "flow_run_id": self.flow_run_id, "error": self.error,
                "counts": dict(self.counts()),
                "subjects": [{"subject": s, "run_id": self.planned.run_ids[s],
                              "outcome": outcomes.get(s)} for s in self.planned.run_ids]}


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


class BackfillReport:
    """A backfill's plan and each period's result.

    A plain class, not a dataclass: Prefect walks whatever a flow returns (dataclasses field
    by field) looking for futures, and the ticks hold every subject's output."""

    __slots__ = ("dry_run", "plan", "results")

    def __init__(self, planned: Plan, results: list[PeriodResult] | None = None,
                 dry_run: bool = False) -> None:
        self.plan = planned
        self.results = results or []
        self.dry_run = dry_run

    def counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for result in self.results:
            total.update(result.counts())
        return total

    def failed(self) -> bool:
        return self.counts()["failed"] > 0

    def summary(self) -> str:
        if self.dry_run:
            return "dry run: " + self.plan.summary()
        counts = self.counts()
        parts = [f"{counts[c]} {c}" for c in COUNTED if counts[c]]
        done = len(self.results)
        ran = sum(1 for r in self.results if r.flow_run_id is not None)
        return (f"backfill {self.plan.label}: {done} of {len(self.plan.periods)} periods "
                f"({ran} run), {', '.join(parts) or 'nothing'}")

    def final_state(self) -> State[Any]:
        if self.failed():
            return Failed(message=self.summary(), data=self)
        return Completed(message=self.summary(), data=self)

    def as_dict(self) -> dict[str, Any]:
        request = self.plan.request
        return {"job": self.plan.job.name, "start": request.periods[0].label,
                "end": request.periods[-1].label, "subjects": request.subjects,
                "reprocess": request.reprocess, "dry_run": self.dry_run,
                "summary": self.summary(), "counts": dict(self.counts()),
                "plan": [p.row() for p in self.plan.periods],
                "periods": [r.as_dict() for r in self.results]}


# --- Prefect's limits -----------------------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    """The names of the Prefect global concurrency limits a backfill of a job runs under."""

    active: str
    rate: str | None


def limit_names(job: str) -> tuple[str, str]:
    """``backfill-<job>`` and ``backfill-<job>:rate`` (a job name has no colon: no clash)."""
    return f"backfill-{job}", f"backfill-{job}:rate"


async def configure_limits(request: Request) -> Limits:
    """Create or update the job's backfill limits on the Prefect server.

    Read in Prefect 3.9's source (``server/models/concurrency_limits_v2.py``,
    ``server/api/concurrency_limits_v2.py``, ``concurrency/services.py``):

    * ``concurrency(name)`` takes a slot with a 300 s lease (renewed by a thread while held,
      given back on exit, back by itself after a crash) and, while the limit is full, retries
      on the server's 423 after its Retry-After (the average slot occupancy, capped at 30 s);
      one queue per limit name in this process keeps the waiters in order.
    * ``rate_limit(name)`` takes a slot that is never given back: the server lets occupied
      slots decay by ``floor(slot_decay_per_second * seconds since the limit last changed)``,
      and a refused attempt also counts as a change. With ``limit=1`` and a decay of
      rate/60 per second, starts are at least 60/rate seconds apart, never closer.
    * A limit with ``active=False`` is not enforced at all, so an update sets it active.
    """
    active, rate = limit_names(request.job.name)
    async with get_client() as client:
        for name, limit, decay in [(active, request.max_active, 0.0),
                                   (rate, 1, (request.rate_per_minute or 0) / 60)]:
            if name == rate and request.rate_per_minute is None:
                continue
            update = GlobalConcurrencyLimitUpdate(limit=limit, active=True,
                                                  slot_decay_per_second=decay)
            try:
                await client.update_global_concurrency_limit(name, update)
            except ObjectNotFound:
                try:
                    await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                        name=name, limit=limit, slot_decay_per_second=decay))
                except ObjectAlreadyExists:  # another backfill of the job created it first
                    await client.update_global_concurrency_limit(name, update)
    return Limits(active, rate if request.rate_per_minute is not None else None)


# --- driving the periods --------------------------------------------------------------------

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
            result = await run_period(ledger, planned.job, period, limits)
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
                     limits: Limits) -> PeriodResult:
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
            await asyncio.to_thread(ledger.unskip, planned.unskip)
        state = await run_job(job=job.name, subjects=planned.run, period=planned.period.label,
                              return_state=True)
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
