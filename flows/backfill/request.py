"""A backfill's parameters, checked before anything is read or run: the job, its periods
from one date to another, the subjects, what to reprocess and how fast."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from flows.jobs import Job
from flows.jobs.schedule import require_due
from flows.registry import get_job
from store import InvalidInput, Period

Reprocess = Literal["none", "failed", "skipped"]
REPROCESS: tuple[Reprocess, ...] = get_args(Reprocess)
MAX_PERIODS = 10_000


class InvalidBackfill(InvalidInput):
    """A backfill's parameters are invalid; nothing was run or written."""


@dataclass(frozen=True)
class Request:
    """A backfill's checked parameters: the job, its periods oldest first, and how to run."""

    job: Job
    periods: list[Period]
    subjects: list[str]
    reprocess: Reprocess = "none"
    max_active: int = 2
    rate_per_minute: float | None = None
    allow_not_due: bool = False


def check(job: str | Job, start: str, end: str, subjects: Sequence[str] | None,
          reprocess: str, max_active: int, rate_per_minute: float | None,
          now: datetime, allow_not_due: bool = False) -> Request:
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
    return Request(definition, periods_between(definition, start, end, now, allow_not_due),
                   chosen, reprocess, max_active, rate_per_minute, allow_not_due)


def periods_between(job: Job, start: str, end: str, now: datetime,
                    allow_not_due: bool = False, limit: int = MAX_PERIODS) -> list[Period]:
    """The job's periods from the one containing ``start`` to the one containing ``end``,
    inclusive, oldest first: at most ``limit``, none not yet due at ``now`` unless
    ``allow_not_due``."""
    first, last = job.parse_period(start), job.parse_period(end)
    if last.start < first.start:
        raise InvalidBackfill(f"end {_named(end, last)} is before start {_named(start, first)}: "
                              f"the start (--from) must be the earlier period")
    require_due(job, last, now, allow_not_due=allow_not_due)
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
