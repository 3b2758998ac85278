"""The periods a drill ticks, counted back from ``now``: the tick refuses a period whose
occurrence is not due yet (``PeriodNotDue``), so fixed calendar dates spread over hundreds of
days run into the future as the calendar moves on (issue 50: drill 1's 500 days from
2026-01-01). Counted back from the latest due period, they are due on any date."""

from __future__ import annotations

from datetime import datetime, timedelta

from flows.jobs import Job
from store import Period

TICK = timedelta(microseconds=1)  # from a period's start into the one before it


def due_periods(job: Job, count: int, now: datetime, *, skip: int = 0) -> list[Period]:
    """``count`` consecutive periods of ``job``, oldest first, the newest ``skip`` periods
    before the latest one due at ``now``."""
    period = job.latest_due_period(now)
    for _ in range(skip):
        period = job.period_at(period.start - TICK)
    found = []
    for _ in range(count):
        found.append(period)
        period = job.period_at(period.start - TICK)
    return found[::-1]


def due_labels(job: Job, count: int, now: datetime, *, skip: int = 0) -> list[str]:
    """The labels (what a tick's ``period`` parameter takes) of ``due_periods``."""
    return [p.label for p in due_periods(job, count, now, skip=skip)]
