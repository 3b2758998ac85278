"""Operational statistics per job and UTC day, from the ledger's own records: logical Runs
completed apart from the attempts spent on them (a Run counts once, however many attempts it
took) and revisions apart from both, lease takeovers, Runs asked for again (duplicates
suppressed), model calls (paid, lost in flight, reused from a checkpoint), tokens and cost, and
outbox messages by state. `runledger stats` prints them; the Prefect events the flows emit say
the same (a test compares them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from flows.spend import Spend, daily_spend
from store import Activity


@dataclass
class DayStats:
    """One job's day (UTC): what completed, what it cost and what was suppressed."""

    job: str
    day: date
    completed: int = 0  # logical Runs completed that day (their first result)
    revised: int = 0  # revisions completed that day (a new result of a completed Run)
    attempts: int = 0  # Attempts started that day
    attempts_per_completed: Counter[int] = field(default_factory=Counter)  # attempts: Runs
    lease_takeovers: int = 0  # Attempts ended that day by another claim taking the Run over
    duplicates: int = 0  # Runs a tick asked for again that were completed
    in_progress_elsewhere: int = 0  # Runs a tick asked for again that another worker held
    messages: Counter[str] = field(default_factory=Counter)  # queued that day, by status now
    spend: Spend = field(default_factory=Spend)  # model calls started that day, of Runs
    revision_spend: Spend = field(default_factory=Spend)  # ... and of revisions

    @property
    def model_calls(self) -> int:
        """Calls paid that day (answered, failed, lost in flight), revisions' included."""
        return self.spend.paid + self.revision_spend.paid

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "day": self.day.isoformat(), "completed": self.completed,
                "revised": self.revised,
                "attempts": self.attempts,
                "attempts_per_completed": {str(k): v for k, v in
                                           sorted(self.attempts_per_completed.items())},
                "lease_takeovers": self.lease_takeovers, "duplicates": self.duplicates,
                "in_progress_elsewhere": self.in_progress_elsewhere,
                "model_calls": self.model_calls, "messages": dict(sorted(self.messages.items())),
                "spend": self.spend.as_dict(), "revision_spend": self.revision_spend.as_dict()}


def daily_stats(activity: Activity, since: datetime,
                calls: list[dict[str, Any]] | None = None) -> list[DayStats]:
    """The ledger's activity and model calls (rows of ``CallBook.since``) from the UTC day of
    ``since`` on, per job and UTC day, by job then day."""
    days: dict[tuple[str, date], DayStats] = {}

    def on(job: str, when: datetime | date | None) -> DayStats | None:
        if when is None:
            return None
        day = when.date() if isinstance(when, datetime) else when
        if day < since.date():
            return None
        return days.setdefault((job, day), DayStats(job, day))

    for row in activity.completed:
        if (stats := on(row["job"], row["completed_at"])) is not None:
            if row.get("revision"):
                stats.revised += 1
                continue
            stats.completed += 1
            stats.attempts_per_completed[row["attempts"]] += 1
    for row in activity.attempts:
        if (started := on(row["job"], row["started_at"])) is not None:
            started.attempts += 1
        if (ended := on(row["job"], row["finished_at"])) is not None:
            ended.lease_takeovers += row["outcome"] == "expired"
    for row in activity.messages:
        if (stats := on(row["job"], row["created_at"])) is not None:
            stats.messages[row["status"]] += 1
    for row in activity.suppressed:
        if (stats := on(row["job"], row["day"])) is not None:
            stats.duplicates += row["duplicates"]
            stats.in_progress_elsewhere += row["in_progress_elsewhere"]
    for (job, day), spent in daily_spend(calls or [], since).items():
        stats = days.setdefault((job, day), DayStats(job, day))
        stats.spend, stats.revision_spend = spent.runs, spent.revisions
    return [days[key] for key in sorted(days)]
