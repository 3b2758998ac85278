"""The status board: per job, whether its recent owed periods completed, what stands in the
way, the next period due and what the recent periods cost (attempts, model calls, tokens and
money). One function computes it (``job_board``) for the `runledger status` command and for the
``runledger-status-<job>`` table artifact, from the ledger as reconcile reads it (and its model
calls as `runledger costs` reads them) and a "now" given by the caller (the database clock by
default). It writes nothing."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from flows.jobs import Job
from flows.occurrences.plan import Step
from flows.occurrences.prepare import prepare
from flows.spend import Spend, spend_of
from store import Ledger, Period

DEFAULT_PERIODS = 7  # owed periods a board shows, newest first

Status = Literal["completed", "pending", "running", "failed", "skipped", "overdue"]
STATUSES: tuple[Status, ...] = ("completed", "pending", "running", "failed", "skipped",
                                "overdue")
_SETTLED: dict[str, Status] = {"completed": "completed", "skipped": "skipped", "failed": "failed"}


def board_status(step: Step) -> Status:
    """One owed occurrence's status on the board: completed, skipped by policy or failed as the
    ledger says; otherwise overdue once reconcile reported it or its due time plus the job's
    grace has passed (the rule reconcile reports by, so the board does not wait for a pass);
    otherwise running while a worker holds its lease or its Run waits for a batch, else
    pending (never started, or stranded)."""
    settled = _SETTLED.get(step.state)
    if settled is not None:
        return settled
    reported = step.occurrence is not None and step.occurrence.overdue_at is not None
    if step.overdue or reported:
        return "overdue"
    return "running" if step.state in ("running", "waiting") else "pending"


@dataclass(frozen=True)
class PeriodStatus:
    """One owed period of a job: its occurrences counted by status, and what its Runs spent:
    attempts and model calls as the Runs count them, and their model calls' tokens and cost
    from the ledger's call records."""

    period: Period
    counts: Counter[Status]
    attempts: int
    model_calls: int
    spend: Spend = field(default_factory=Spend)

    @property
    def owed(self) -> int:
        return sum(self.counts.values())

    @property
    def complete(self) -> bool:
        """Every subject owed for the period has a completed Run."""
        return self.counts["completed"] == self.owed

    def row(self, job: str) -> dict[str, Any]:
        return {"job": job, "period": self.period.label,
                "period_start": self.period.start.isoformat(), "owed": self.owed,
                **{s: self.counts[s] for s in STATUSES}, "attempts": self.attempts,
                "model_calls": self.model_calls, "tokens": self.spend.tokens,
                "cost": self.spend.money()}


@dataclass(frozen=True)
class Board:
    """A job's status board at ``now``: its last ``periods`` owed periods, newest first."""

    job: Job
    now: datetime
    periods: list[PeriodStatus]
    next_due: Period
    next_due_at: datetime
    spend: Spend = field(default_factory=Spend)  # the model calls of the periods shown

    @property
    def last_complete(self) -> Period | None:
        """The newest period shown whose every owed subject completed."""
        return next((p.period for p in self.periods if p.complete), None)

    @property
    def attempts(self) -> int:
        return sum(p.attempts for p in self.periods)

    @property
    def model_calls(self) -> int:
        return sum(p.model_calls for p in self.periods)


    def summary(self) -> str:
        """One line: the last complete period, the next one due (in the job's timezone) and
        what the periods shown spent."""
        last = self.last_complete
        due = self.next_due_at.astimezone(ZoneInfo(self.job.timezone))
        if not self.periods:
            spent = "no period owed yet"
        else:
            shown = len(self.periods)
            spent = (f"{self.attempts} attempts and {self.model_calls} model calls in the "
                     f"{shown} period{'s' if shown > 1 else ''} shown, {self.spend.tokens} "
                     f"tokens, cost {self.spend.money()}")
        return (f"{self.job.name}: last complete period "
                f"{last.label if last else 'none shown'}; next due {self.next_due.label} at "
                f"{due.isoformat(timespec='minutes')}; {spent}")

    def rows(self) -> list[dict[str, Any]]:
        """One row per period shown, newest first (the table artifact's rows)."""
        return [p.row(self.job.name) for p in self.periods]

    def as_dict(self) -> dict[str, Any]:
        last = self.last_complete
        return {"job": self.job.name, "version": self.job.version, "now": self.now.isoformat(),
                "last_complete_period": last.label if last else None,
                "next_due_period": self.next_due.label,
                "next_due_at": self.next_due_at.isoformat(), "attempts": self.attempts,
                "model_calls": self.model_calls, "spend": self.spend.as_dict(),
                "summary": self.summary(),
                "periods": self.rows()}


def recent_periods_start(job: Job, now: datetime, periods: int) -> datetime:
    """The start of the oldest of the job's ``periods`` latest periods due by ``now``."""
    period = job.latest_due_period(now)
    for _ in range(periods - 1):
        period = job.period_at(period.start - timedelta(microseconds=1))
    return period.start


def job_board(ledger: Ledger, job: Job, now: datetime | None = None,
              periods: int = DEFAULT_PERIODS) -> Board:
    """The job's board at ``now`` (default: the database clock) over its ``periods`` latest
    owed periods; reads only (reconcile's plan, as a dry run, and the model calls started
    since the oldest period shown began, the read `runledger costs` makes; a revision's calls
    are its own, in `runledger costs`)."""
    now = ledger.now() if now is None else now
    since = recent_periods_start(job, now, periods)
    planned = prepare(ledger, job, now, dry_run=True, since=since)
    by_period: dict[datetime, list[Step]] = {}
    for step in planned.steps:
        by_period.setdefault(step.owed.period.start, []).append(step)
    calls: dict[str, list[dict[str, Any]]] = {}
    for row in ledger.calls.since(since, job.name):
        calls.setdefault(row["run_id"], []).append(row)

    def spent(steps: list[Step]) -> Spend:
        return spend_of([row for s in steps if s.run is not None
                         for row in calls.get(s.run.run_id, [])])

    shown = [PeriodStatus(steps[0].owed.period, Counter(board_status(s) for s in steps),
                          sum(s.run.attempts for s in steps if s.run is not None),
                          sum(s.run.model_calls for s in steps if s.run is not None),
                          spent(steps))
             for _, steps in sorted(by_period.items(), reverse=True)]
    upcoming = job.period_at(job.latest_due_period(now).end)
    return Board(job, now, shown, upcoming, job.due_at(upcoming), spent(planned.steps))
