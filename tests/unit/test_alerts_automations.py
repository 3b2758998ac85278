"""The alert automations as data (no server): what they react to, and how long each job's dead
man's switch waits for a tick, from its cadence and grace."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flows.jobs import Candidate, Job
from flows.stack.automations import (
    ALERTS,
    BUDGET_ALERT,
    alert_automation,
    budget_automation,
    cadence_length,
    dead_mans_switch,
    switch_within,
)
from flows.stack.processes import StackError
from store import OutboxMessage, Period

NOW = datetime(2026, 10, 20, 12, tzinfo=UTC)  # a Tuesday; Europe ends DST on Sunday the 25th
BLOCK = uuid.UUID(int=7)


def job(cadence: str, timezone: str = "UTC", grace: timedelta = timedelta(hours=1)) -> Job:
    def collect(subject: str, period: Period) -> dict[str, Any]:
        return {}

    def transform(raw: dict[str, Any], model: Any) -> Candidate:
        return Candidate("", "none")

    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return []

    return Job(name="probe", version="1", cadence=cadence, timezone=timezone, subjects=["a"],
               collect=collect, transform=transform, validate=lambda c: None,
               messages=messages, grace=grace)


@pytest.mark.parametrize(("cadence", "timezone", "longest"), [
    ("hourly", "Europe/Paris", timedelta(hours=1)),
    ("daily", "UTC", timedelta(days=1)),
    ("daily", "Europe/Paris", timedelta(hours=25)),
    ("weekly", "UTC", timedelta(days=7)),
    ("monthly", "UTC", timedelta(days=31)),
    ("* * * * *", "UTC", timedelta(minutes=1)),
    ("0 9 * * 1-5", "UTC", timedelta(days=3)),
    ("0 9 * * *", "Europe/Paris", timedelta(hours=25)),
    # Friday 17:55 to Monday 09:00, one hour longer on the weekend DST ends.
    ("*/5 9-17 * * 1-5", "America/New_York", timedelta(days=2, hours=16, minutes=5)),
    ("30 6 1,15 * *", "UTC", timedelta(days=17)),
])
def test_a_cadence_is_as_long_as_its_longest_period_in_the_year_ahead(
        cadence: str, timezone: str, longest: timedelta) -> None:
    """A weekday cron's weekend, the 25-hour day DST ends with, a 31-day month count."""
    assert cadence_length(job(cadence, timezone), NOW) == longest


def test_the_dead_mans_switch_waits_one_cadence_plus_grace_for_the_jobs_tick() -> None:
    """A per-minute job with 5 s of grace is expected to complete a tick every 65 s."""
    minutely = job("* * * * *", grace=timedelta(seconds=5))
    assert switch_within(minutely, NOW) == timedelta(seconds=65)
    switch = dead_mans_switch(minutely, BLOCK, NOW)
    assert switch.name == "runledger: probe stopped ticking"
    assert switch.trigger.posture == "Proactive"  # type: ignore[union-attr]
    assert switch.trigger.expect == {"runledger.tick.completed"}  # type: ignore[union-attr]
    assert switch.trigger.match.root == {  # type: ignore[union-attr]
        "prefect.resource.id": "runledger.job.probe"}
    assert switch.trigger.within == timedelta(seconds=65)  # type: ignore[union-attr]


def test_a_switch_never_waits_less_than_the_ten_seconds_prefect_allows() -> None:
    """A computed window is raised to 10 s; a shorter override is refused."""
    assert switch_within(job("* * * * *", grace=timedelta(0)), NOW) == timedelta(minutes=1)
    with pytest.raises(StackError, match="at least 10 s"):
        dead_mans_switch(job("daily"), BLOCK, NOW, within=timedelta(seconds=5))


def test_the_alert_reacts_to_each_overdue_or_given_up_occurrence_once() -> None:
    """Reactive, threshold 1, no window: every event is one notification through the block."""
    alert = alert_automation(BLOCK)
    assert alert.name == ALERTS
    trigger: Any = alert.trigger
    assert trigger.expect == {"runledger.run.overdue", "runledger.run.gave-up"}
    assert (trigger.posture, trigger.threshold, trigger.within) == (
        "Reactive", 1, timedelta(0))
    assert trigger.match.root == {"prefect.resource.id": "runledger.run.*"}
    [action] = alert.actions
    assert action.block_document_id == BLOCK  # type: ignore[union-attr]


def test_the_budget_alert_reacts_to_each_exhausted_window_once() -> None:
    """Reactive, threshold 1, on any job's runledger.budget.exhausted: one notification per
    window, saying what was spent and how to raise the cap."""
    alert = budget_automation(BLOCK)
    assert alert.name == BUDGET_ALERT
    trigger: Any = alert.trigger
    assert trigger.expect == {"runledger.budget.exhausted"}
    assert (trigger.posture, trigger.threshold) == ("Reactive", 1)
    assert trigger.match.root == {"prefect.resource.id": "runledger.job.*"}
    [action] = alert.actions
    assert "event.payload.fix" in action.body  # type: ignore[union-attr]
