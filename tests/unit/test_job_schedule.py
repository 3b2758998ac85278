"""A job's schedule derived from its cadence, timezone and due time, and checked against it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flows.errors import InvalidJob, PeriodNotDue
from flows.jobs import Job
from flows.jobs.schedule import derived_cron, require_due, schedule_disagreement

START = datetime(2026, 3, 20, tzinfo=UTC)  # the next slots cross Europe's DST change


def job(cadence: str, due: timedelta, timezone: str = "Europe/Paris") -> Job:
    def nothing(*_: Any) -> Any:
        return None

    return Job(name="j", version="1", cadence=cadence, timezone=timezone, subjects=["a"],
               collect=nothing, transform=nothing, validate=nothing, messages=nothing, due=due)


@pytest.mark.parametrize(("cadence", "due", "cron"), [
    ("hourly", timedelta(minutes=5), "5 * * * *"),
    ("daily", timedelta(hours=7, minutes=30), "30 7 * * *"),
    ("weekly", timedelta(days=1, hours=9), "0 9 * * 2"),
    ("weekly", timedelta(days=6), "0 0 * * 0"),
    ("monthly", timedelta(days=2, hours=6), "0 6 3 * *"),
    ("0 9 * * 1-5", timedelta(0), "0 9 * * 1-5"),
])
def test_the_derived_cron_fires_once_per_period_at_its_due_time(
        cadence: str, due: timedelta, cron: str) -> None:
    """The derived cron is the one the check accepts, across a DST change."""
    the_job = job(cadence, due)
    assert derived_cron(the_job) == cron
    assert schedule_disagreement(the_job, cron, "Europe/Paris", START) is None


@pytest.mark.parametrize(("cadence", "due"), [
    ("daily", timedelta(hours=7, seconds=30)),   # no cron has seconds
    ("monthly", timedelta(days=29)),             # February has no 30th
    ("0 9 * * 1-5", timedelta(hours=1)),         # a cron cadence is its own schedule
])
def test_a_due_time_no_cron_can_express_asks_for_a_hand_written_schedule(
        cadence: str, due: timedelta) -> None:
    """Rather than a schedule that drifts, an error that says what to write."""
    with pytest.raises(InvalidJob, match="write its deployment's schedule by hand"):
        derived_cron(job(cadence, due))


def test_a_schedule_that_skips_periods_is_refused() -> None:
    """A weekday-only cron for a daily job leaves weekend periods without a tick."""
    why = schedule_disagreement(job("daily", timedelta(0)), "0 0 * * 1-5", "Europe/Paris", START)
    assert why is not None and "skips or repeats a daily period" in why


def test_a_period_not_yet_due_is_refused_naming_the_flag_and_the_parameter() -> None:
    """Before its due time a period is refused unless allowed; at its due time it runs."""
    daily = job("daily", timedelta(hours=7), timezone="UTC")
    period = daily.parse_period("2026-03-20")
    before = datetime(2026, 3, 20, 6, 59, tzinfo=UTC)
    with pytest.raises(PeriodNotDue) as refused:
        require_due(daily, period, before)
    message = str(refused.value)
    assert message.startswith("period 2026-03-20 of job j is not due until 2026-03-20 07:00 UTC")
    assert "--allow-not-due (CLI) or the parameter allow_not_due=true (Custom run)" in message
    require_due(daily, period, before, allow_not_due=True)
    require_due(daily, period, datetime(2026, 3, 20, 7, tzinfo=UTC))
