"""Periods: the nominal window [start, end) of one occurrence, computed in the job's timezone."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from store.errors import InvalidPeriod
from store.identity import require_aware

NAMED_CADENCES = ("hourly", "daily", "weekly", "monthly")


def zone(name: str) -> ZoneInfo:
    """The IANA timezone called ``name``; an unknown name is an error, never UTC by default."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidPeriod(f"unknown IANA timezone {name!r}") from exc


def validate_cadence(cadence: str) -> str:
    """Return the cadence if it is a named cadence or a valid 5-field cron expression."""
    if cadence in NAMED_CADENCES:
        return cadence
    if not isinstance(cadence, str) or len(cadence.split()) != 5 or not croniter.is_valid(cadence):
        raise InvalidPeriod(
            f"cadence must be one of {', '.join(NAMED_CADENCES)} or a 5-field cron expression, "
            f"got {cadence!r}"
        )
    return cadence


def _local_midnight(day: date, tz: ZoneInfo) -> datetime:
    # A zone may skip local midnight (DST at 00:00); round-tripping through UTC lands on the
    # first instant that exists that day.
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC).astimezone(tz)


@dataclass(frozen=True)
class Period:
    """A half-open window [start, end) in UTC; ``timezone`` is the zone it was computed in."""

    start: datetime
    end: datetime
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", require_aware(self.start, "period start"))
        object.__setattr__(self, "end", require_aware(self.end, "period end"))
        if self.end <= self.start:
            raise InvalidPeriod(f"period end {self.end} must be after start {self.start}")

    @classmethod
    def containing(cls, nominal: datetime, cadence: str, timezone: str) -> Period:
        """The period of ``cadence`` in ``timezone`` that contains the nominal instant."""
        tz = zone(timezone)
        local = require_aware(nominal, "nominal time").astimezone(tz)
        cadence = validate_cadence(cadence)
        if cadence == "hourly":
            # Truncating keeps `fold`, so the repeated fall-back hour gives two distinct periods.
            start = local.replace(minute=0, second=0, microsecond=0)
            start_utc = start.astimezone(UTC)
            return cls(start_utc, start_utc + timedelta(hours=1), timezone)
        if cadence in ("daily", "weekly", "monthly"):
            day = local.date()
            if cadence == "daily":
                first, after = day, day + timedelta(days=1)
            elif cadence == "weekly":
                first = day - timedelta(days=day.weekday())
                after = first + timedelta(days=7)
            else:
                first = day.replace(day=1)
                after = (first + timedelta(days=32)).replace(day=1)
            return cls(_local_midnight(first, tz), _local_midnight(after, tz), timezone)
        # cron: the latest fire time at or before the nominal instant, to the next fire time.
        start_local = croniter(cadence, local + timedelta(seconds=1)).get_prev(datetime)
        end_local = croniter(cadence, start_local).get_next(datetime)
        return cls(start_local, end_local, timezone)

    @classmethod
    def parse(cls, text: str, cadence: str, timezone: str) -> Period:
        """The period named by ``text``: a date (``2026-11-29``) in the job's timezone, or an
        ISO-8601 datetime with an offset (``2026-11-29T09:00:00+01:00``) inside the period."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidPeriod("period must be a non-empty string such as 2026-11-29")
        value = text.strip()
        try:
            if len(value) == 10:
                day = date.fromisoformat(value)
                nominal = _local_midnight(day, zone(timezone))
            else:
                nominal = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise InvalidPeriod(
                f"period {text!r} is not a date (YYYY-MM-DD) nor an ISO-8601 datetime with an "
                "offset (YYYY-MM-DDTHH:MM:SS+HH:MM)"
            ) from exc
        if nominal.tzinfo is None:
            raise InvalidPeriod(
                f"period {text!r} is a naive datetime: add an offset such as +00:00, "
                "or give a date (YYYY-MM-DD) in the job's timezone"
            )
        return cls.containing(nominal, cadence, timezone)

    @property
    def label(self) -> str:
        """The period start as local ISO time in the period's timezone (for names and logs)."""
        local = self.start.astimezone(zone(self.timezone))
        if local.time() == time(0):
            return local.date().isoformat()
        return local.isoformat(timespec="minutes")
