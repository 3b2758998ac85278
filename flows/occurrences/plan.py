"""What a job owes and what reconcile does about each owed occurrence, decided from the ledger's
facts and a "now" given by the caller (the database clock by default): no I/O here, so a test
can replay a week of downtime in a second.

An occurrence is one (subject, period) of the job's current version, owed from the subject's
first period (its obligation), due at its scheduled slot (``Job.due_at``). It ends completed,
skipped by the missed-run policy (a durable decision), or failed and reported."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from flows.jobs import Job
from store import Occurrence, Period, RunIdentity, RunState

DEFAULT_CAP = 1_000  # occurrences one pass acts on per job (runs, re-drives, skips), oldest first

State = Literal["completed", "skipped", "failed", "running", "waiting", "stranded", "missed",
                "upcoming"]
Action = Literal["none", "run", "redrive", "wait", "skip", "give-up"]
STATES: tuple[State, ...] = ("completed", "skipped", "failed", "running", "waiting", "stranded",
                             "missed", "upcoming")
ACTIONS: tuple[Action, ...] = ("none", "run", "redrive", "wait", "skip", "give-up")


@dataclass(frozen=True)
class Owed:
    """One occurrence the job owes: a subject's period of the job's current version."""

    subject: str
    period: Period
    identity: RunIdentity
    due_at: datetime


@dataclass(frozen=True)
class Step:
    """Where one owed occurrence stands, what reconcile does about it, and why."""

    owed: Owed
    state: State
    action: Action
    reason: str
    overdue: bool
    run: RunState | None = None
    occurrence: Occurrence | None = None


@dataclass(frozen=True)
class Plan:
    """One job's owed occurrences in the window, oldest first, and how many the cap left out."""

    job: Job
    now: datetime
    window_start: datetime
    steps: list[Step]
    capped: int

    def acting(self, *actions: Action) -> list[Step]:
        return [s for s in self.steps if s.action in actions]

    def overdue(self) -> list[Step]:
        return [s for s in self.steps if s.overdue]


def window_start(job: Job, now: datetime) -> datetime:
    """The start of the oldest period reconcile looks at: the one ``catch_up_window`` ago."""
    return job.period_at(now - job.catch_up_window).start


def first_owed(job: Job, now: datetime, known: Mapping[str, datetime],
               first_run: datetime | None = None) -> datetime:
    """The period a subject reconcile sees for the first time is owed from: the job's ``start``
    when the job is new to the ledger, else the period of ``now`` (never the past); or the
    period of the subject's first Run in the window when that is earlier (the job ran before
    reconcile first looked)."""
    if not known and job.start is not None:
        start = job.period_at(job.start).start
    else:
        start = job.period_at(now).start
    return start if first_run is None else min(start, first_run)


def _periods(job: Job, since: datetime, now: datetime) -> list[Period]:
    """The job's periods from the one starting at ``since`` whose occurrence is due by ``now``."""
    periods: list[Period] = []
    period = job.period_at(since)
    while job.due_at(period) <= now:
        periods.append(period)
        period = job.period_at(period.end)
    return periods


def owed_occurrences(job: Job, owed_from: Mapping[str, datetime], now: datetime,
                     since: datetime | None = None) -> list[Owed]:
    """The occurrences due by ``now`` from the period starting at ``since`` (default: the
    window's start), for the job's current subjects from the period each is owed from, oldest
    first."""
    since = window_start(job, now) if since is None else since
    subjects = [s for s in job.subject_names() if s in owed_from]
    if not subjects:
        return []
    earliest = max(since, min(owed_from[s] for s in subjects))
    return [Owed(subject, period, job.identity(subject, period), job.due_at(period))
            for period in _periods(job, earliest, now)
            for subject in subjects if period.start >= owed_from[subject]]


def asked_for(job: Job, owed: Iterable[Owed], runs: Mapping[str, RunState],
              now: datetime) -> list[Owed]:
    """The stranded Runs of the job's current version and subjects in the window that no
    obligation owes (a period run by hand before reconcile first saw the job, e.g. one left
    over budget), due by ``now``: someone asked for each, so each is re-driven like an owed
    one. Oldest first."""
    known = {o.identity.run_id for o in owed}
    subjects = set(job.subject_names())
    found = []
    for run in runs.values():
        if run.run_id in known or not run.stranded or run.version != job.version \
                or run.subject not in subjects:
            continue
        period = job.period_at(run.period_start)
        identity = job.identity(run.subject, period)
        # A Run of another cadence's period (the job's cadence changed) is not this job's.
        if identity.run_id == run.run_id and job.due_at(period) <= now:
            found.append(Owed(run.subject, period, identity, job.due_at(period)))
    return sorted(found, key=lambda o: (o.period.start, o.subject))


def redrive_delay(attempts: int, base: timedelta, ceiling: timedelta) -> timedelta:
    """How long after its last change a stranded Run waits before the next re-drive: nothing
    before the first attempt, then ``base`` doubling per attempt up to ``ceiling``."""
    if attempts <= 0:
        return timedelta(0)
    return min(base * (1 << min(attempts - 1, 30)), ceiling)


def _latest_by_subject(owed: Iterable[Owed]) -> dict[str, Period]:
    latest: dict[str, Period] = {}
    for o in owed:
        if o.subject not in latest or o.period.start > latest[o.subject].start:
            latest[o.subject] = o.period
    return latest


def plan(job: Job, owed: list[Owed], runs: Mapping[str, RunState],
         occurrences: Mapping[str, Occurrence], now: datetime, *, cap: int = DEFAULT_CAP,
         backoff: timedelta = timedelta(minutes=1),
         max_backoff: timedelta = timedelta(hours=1)) -> Plan:
    """Decide each owed occurrence: completed, skipped and failed ones are left as they are
    (a failure is never retried here); a live Run is left to its holder; a stranded Run is
    re-driven after its backoff, or given up past ``max_attempts``; one nobody started is left
    to the scheduler until its due time plus ``max_lateness``, then the missed-run policy
    decides. Any not completed or skipped by its due time plus ``grace`` is overdue. Only the
    ``cap`` oldest occurrences with something to do are acted on; the rest wait a pass."""
    latest = _latest_by_subject(owed)
    steps: list[Step] = []
    acting = capped = 0
    for o in owed:
        run = runs.get(o.identity.run_id)
        occurrence = occurrences.get(o.identity.run_id)
        state, action, reason = _decide(job, o, run, occurrence, latest[o.subject], now,
                                        backoff, max_backoff)
        if action not in ("none", "wait"):
            acting += 1
            if acting > cap:
                capped += 1
                action, reason = "wait", f"left for the next pass (cap of {cap}); {reason}"
        late = now >= o.due_at + job.grace and state not in ("completed", "skipped")
        steps.append(Step(o, state, action, reason, late, run, occurrence))
    return Plan(job, now, window_start(job, now), steps, capped)


def _decide(job: Job, o: Owed, run: RunState | None, occurrence: Occurrence | None,
            latest: Period, now: datetime, backoff: timedelta,
            max_backoff: timedelta) -> tuple[State, Action, str]:
    if run is not None:
        return _decide_started(job, run, now, backoff, max_backoff)
    if occurrence is not None and occurrence.skipped_at is not None:
        return "skipped", "none", occurrence.skip_reason or "skipped"
    if now < o.due_at + job.lateness_allowed:
        return "upcoming", "none", "due; its schedule may still run it"
    if job.missed_runs == "catch-up":
        return "missed", "run", "missed; policy catch-up"
    if job.missed_runs == "latest" and o.period.start == latest.start:
        return "missed", "run", "missed; policy latest: the latest due period"
    if job.missed_runs == "latest":
        return "missed", "skip", f"superseded by {latest.label}"
    return "missed", "skip", "missed while nothing ran; policy skip"


def _decide_started(job: Job, run: RunState, now: datetime, backoff: timedelta,
                    max_backoff: timedelta) -> tuple[State, Action, str]:
    if run.status == "completed":
        return "completed", "none", "completed"
    if run.status == "failed":
        return "failed", "none", f"failed: {run.error}; requeue it with `runledger runs requeue`"
    if run.status == "waiting":  # no lease, and none needed: its batch's poll releases it
        return "waiting", "none", ("its model call waits in a batch at the provider "
                                   "(`runledger batches list`)")
    if not run.stranded:
        return "running", "none", "a worker holds its lease"
    if run.attempts >= job.max_attempts:
        return "stranded", "give-up", f"used {run.attempts} of {job.max_attempts} attempts"
    ready = run.updated_at + redrive_delay(run.attempts, backoff, max_backoff)
    if now < ready:
        return "stranded", "wait", f"re-driven after {ready.isoformat(timespec='seconds')}"
    return "stranded", "redrive", (f"{run.status} after {run.attempts} attempts"
                                   + (f" ({run.error})" if run.error else ""))
