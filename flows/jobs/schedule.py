"""A job's schedule: the cron that fires once per period at the job's due time, derived from the
Job, and the check that a deployment's schedule agrees with it (else ``status`` reports a wrong
next due time and reconcile calls the job's first periods missed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

from croniter import croniter

from flows.errors import InvalidJob, PeriodNotDue
from flows.jobs.job import Job
from store import Period

# How a person says "run it anyway", in the refusal: the CLI flag and the flow parameter.
NOT_DUE_FLAG = "--allow-not-due"
NOT_DUE_PARAMETER = "allow_not_due"

# Enough consecutive slots to cross a DST change and a month boundary from any start.
SLOTS_CHECKED = 40
MINUTE = timedelta(minutes=1)


def derived_cron(job: Job) -> str:
    """The 5-field cron, in the job's timezone, that fires at each period's due time; a cadence
    and ``due`` no cron can express is an error saying to write the schedule by hand."""
    due = job.due
    whole_minutes = due % MINUTE == timedelta(0)
    minute, hour = int(due.seconds // 60 % 60), int(due.seconds // 3600)
    if job.cadence not in ("hourly", "daily", "weekly", "monthly"):
        if due == timedelta(0):
            return job.cadence
    elif whole_minutes and job.cadence == "hourly" and due < timedelta(hours=1):
        return f"{minute} * * * *"
    elif whole_minutes and job.cadence == "daily" and due < timedelta(days=1):
        return f"{minute} {hour} * * *"
    elif whole_minutes and job.cadence == "weekly" and due < timedelta(days=7):
        return f"{minute} {hour} * * {(1 + due.days) % 7}"  # periods start on Monday (cron 1)
    elif whole_minutes and job.cadence == "monthly" and due < timedelta(days=28):
        return f"{minute} {hour} {1 + due.days} * *"
    raise InvalidJob(f"job {job.name}: no cron fires at due={due} after the start of each "
                     f"{job.cadence!r} period; write its deployment's schedule by hand")


def schedule_disagreement(job: Job, cron: str, timezone: str | None,
                          start: datetime) -> str | None:
    """Why a cron schedule in ``timezone`` does not fire once per period at the job's due time
    (checked over the slots after ``start``), or None when it agrees."""
    if timezone != job.timezone:
        return (f"its schedule runs in {timezone or 'UTC'} but job {job.name} counts periods in "
                f"{job.timezone}")
    slots = croniter(cron, start.astimezone(ZoneInfo(job.timezone)))
    fired = [slots.get_next(datetime).astimezone(UTC) for _ in range(SLOTS_CHECKED)]
    periods = [job.period_at(slot) for slot in fired]
    for (a, b) in pairwise(periods):
        if a.end != b.start:
            return (f"cron {cron!r} skips or repeats a {job.cadence} period around "
                    f"{a.label}; job {job.name} owes every period")
    local = ZoneInfo(job.timezone)
    for slot, period in zip(fired, periods, strict=True):
        due = job.due_at(period)
        if due != slot:
            return (f"cron {cron!r} fires at {slot.astimezone(local):%Y-%m-%d %H:%M %Z} but "
                    f"job {job.name}'s period {period.label} is due at "
                    f"{due.astimezone(local):%Y-%m-%d %H:%M %Z}; use cron {_suggestion(job)}")
    return None


def _suggestion(job: Job) -> str:
    try:
        return repr(derived_cron(job))
    except InvalidJob:
        return "one that fires at each period's due time"


def require_due(job: Job, period: Period, now: datetime, *, allow_not_due: bool = False) -> None:
    """Refuse (``PeriodNotDue``) a period whose occurrence is not due at ``now``, unless the
    person said so explicitly."""
    due = job.due_at(period)
    if due <= now or allow_not_due:
        return
    local = ZoneInfo(job.timezone)
    due_text = f"{due.astimezone(local):%Y-%m-%d %H:%M %Z}"
    now_text = f"{now.astimezone(local):%Y-%m-%d %H:%M %Z}"
    raise PeriodNotDue(
        f"period {period.label} of job {job.name} is not due until {due_text} (now "
        f"{now_text}); a completed Run never changes, so running it now would lock in early "
        f"content. To run it anyway: {NOT_DUE_FLAG} (CLI) or the parameter "
        f"{NOT_DUE_PARAMETER}=true (Custom run)")
