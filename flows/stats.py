"""Operational statistics per job and UTC day, from the ledger's own records: logical Runs
completed apart from the attempts spent on them (seed 001), lease takeovers, Runs asked for
again (duplicates suppressed), model calls and outbox messages by state. `runledger stats`
prints them; the Prefect events the flows emit say the same (a test compares them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from store import Activity


@dataclass
class DayStats:
    """One job's day (UTC): what completed, what it cost and what was suppressed."""

    job: str
    day: date
    completed: int = 0  # logical Runs completed that day
    attempts: int = 0  # Attempts started that day
    attempts_per_completed: Counter[int] = field(default_factory=Counter)  # attempts: Runs
    lease_takeovers: int = 0  # Attempts ended that day by another claim taking the Run over
    duplicates: int = 0  # Runs a tick asked for again that were completed
    in_progress_elsewhere: int = 0  # Runs a tick asked for again that another worker held
    model_calls: int = 0  # calls of the Attempts that ended that day
    messages: Counter[str] = field(default_factory=Counter)  # queued that day, by status now

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "day": self.day.isoformat(), "completed": self.completed,
                "attempts": self.attempts,
                "attempts_per_completed": {str(k): v for k, v in
                                           sorted(self.attempts_per_completed.items())},
                "lease_takeovers": self.lease_takeovers, "duplicates": self.duplicates,
                "in_progress_elsewhere": self.in_progress_elsewhere,
                "model_calls": self.model_calls, "messages": dict(sorted(self.messages.items()))}


def daily_stats(activity: Activity, since: datetime) -> list[DayStats]:
    """The ledger's activity from the UTC day of ``since`` on, per job and UTC day, by job then
    day."""
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
            stats.completed += 1
            stats.attempts_per_completed[row["attempts"]] += 1
    for row in activity.attempts:
        if (started := on(row["job"], row["started_at"])) is not None:
            started.attempts += 1
        if (ended := on(row["job"], row["finished_at"])) is not None:
            ended.lease_takeovers += row["outcome"] == "expired"
            ended.model_calls += row["model_calls"] or 0
    for row in activity.messages:
        if (stats := on(row["job"], row["created_at"])) is not None:
            stats.messages[row["status"]] += 1
    for row in activity.suppressed:
        if (stats := on(row["job"], row["day"])) is not None:
            stats.duplicates += row["duplicates"]
            stats.in_progress_elsewhere += row["in_progress_elsewhere"]
    return [days[key] for key in sorted(days)]
