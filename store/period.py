"""Periods: the nominal window [start, end) of one occurrence, computed in the job's timezone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from store.errors import InvalidPeriod
from store.identity import require_aware

NAMED_CADENCES = ("hourly", "daily", "weekly", "monthly")
# Further than any DST shift: a cron scan looks this far past the nominal wall time, because a
# shifted or repeated wall time can land on the other side of it.
_DST_SLACK = timedelta(hours=3)
# Far from any offset change, wall order is UTC order: a scan need not look further.
_STEADY_SLACK = timedelta(minutes=1)
_MAX_CRON_STEPS = 10_000


def zone(name: str) -> ZoneInfo:
    """The IANA timezone called ``name``; an unknown name is an error, never UTC by default."""
    if not isinstance(name, str):
        raise InvalidPeriod(f"timezone must be an IANA name such as Europe/Paris, got "
                            f"{type(name).__name__}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # OSError: a name too long for a file name of the tz database.
        shown = name if len(name) <= 100 else name[:100] + "..."
        raise InvalidPeriod(f"unknown IANA timezone {shown!r}") from exc


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


def _fires(wall: datetime, tz: ZoneInfo, repeats: bool) -> list[datetime]:
    """The UTC instants at which a cron schedule fires for the naive local wall time ``wall``.

    A wall time skipped by spring-forward fires shifted by the gap (02:30 -> 03:30, PEP 495
    fold=0). A wall time the clock repeats at fall-back fires at its first occurrence, and at
    its second one too when the schedule ``repeats`` with the clock (its minute or hour field
    is a wildcard, as Vixie cron does): an hourly schedule gets two distinct repeated hours."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    return [first, second] if repeats and second > first else [first]


def _slack(tz: ZoneInfo, origin: datetime) -> timedelta:
    """How far past ``origin``'s wall time a cron scan looks: the DST slack if the zone's UTC
    offset changes within it (no zone changes twice in six hours), else a minute."""
    before = (origin - _DST_SLACK).astimezone(tz).utcoffset()
    after = (origin + _DST_SLACK).astimezone(tz).utcoffset()
    return _DST_SLACK if before != after else _STEADY_SLACK


def _cron_scan(
    cadence: str, tz: ZoneInfo, origin: datetime, forward: bool, keep: Callable[[datetime], bool]
) -> datetime:
    """The first (forward) or last (backward) fire instant that ``keep`` accepts, scanning the
    schedule's wall times from beyond ``origin`` (an instant) by the DST slack."""
    fields = cadence.split()
    repeats = fields[0].startswith("*") or fields[1].startswith("*")
    wall = origin.astimezone(tz).replace(tzinfo=None)
    slack = _slack(tz, origin)
    schedule = croniter(cadence, wall - slack if forward else wall + slack)
    found: list[datetime] = []
    for _ in range(_MAX_CRON_STEPS):
        step = schedule.get_next(datetime) if forward else schedule.get_prev(datetime)
        found += [f for f in _fires(step, tz, repeats) if keep(f)]
        past = step > wall + slack if forward else step < wall - slack
        if found and past:
            return min(found) if forward else max(found)
    raise InvalidPeriod(f"cron cadence {cadence!r} does not fire near {origin.isoformat()}")


@contextmanager
def _calendar_edges(cadence: str, timezone: str, near: str) -> Iterator[None]:
    """Turn the arithmetic errors of a period that cannot exist into InvalidPeriod: one that
    would start or end outside years 1 to 9999, or a cron schedule that never fires there."""
    try:
        yield
    except InvalidPeriod:
        raise
    except CroniterError as exc:
        raise InvalidPeriod(f"cron cadence {cadence!r} does not fire near {near}") from exc
    except (OverflowError, ValueError) as exc:
        # datetime, dateutil and croniter say "date value out of range", "year 0 is out of
        # range": the cadence was checked already, only the calendar's edge is left.
        raise InvalidPeriod(
            f"no period of cadence {cadence!r} in {timezone} contains {near}: it would begin or end "
            "outside the years 1 to 9999"
        ) from exc


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
        object.__setattr__(self, "start", require_aware(self.start, "period start", InvalidPeriod))
        object.__setattr__(self, "end", require_aware(self.end, "period end", InvalidPeriod))
        if self.end <= self.start:
            raise InvalidPeriod(f"period end {self.end} must be after start {self.start}")

    @staticmethod
    def check_cadence(cadence: str, timezone: str) -> None:
        """Refuse (``InvalidPeriod``) a cadence or timezone that cannot make periods."""
        validate_cadence(cadence)
        zone(timezone)

    @classmethod
    def containing(cls, nominal: datetime, cadence: str, timezone: str) -> Period:
        """The period of ``cadence`` in ``timezone`` that contains the nominal instant."""
        tz = zone(timezone)
        nominal = require_aware(nominal, "nominal time", InvalidPeriod)
        cadence = validate_cadence(cadence)
        with _calendar_edges(cadence, timezone, nominal.isoformat()):
            return cls._containing(nominal.astimezone(tz), cadence, tz, timezone)

    @classmethod
    def _containing(cls, local: datetime, cadence: str, tz: ZoneInfo, timezone: str) -> Period:
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
        # cron: the latest fire instant at or before the nominal one, to the next fire instant.
        instant = local.astimezone(UTC)
        start = _cron_scan(cadence, tz, instant, forward=False, keep=lambda f: f <= instant)
        end = _cron_scan(cadence, tz, start, forward=True, keep=lambda f: f > start)
        return cls(start, end, timezone)

    @classmethod
    def parse(cls, text: str, cadence: str, timezone: str) -> Period:
        """The period named by ``text``: an ISO-8601 datetime with an offset
        (``2026-11-29T09:00:00+01:00``) inside the period, or a date (``2026-11-29``) in the
        job's timezone: the period containing its local midnight, unless that one ends the same
        day (a cron schedule firing at 02:30), then the first period starting that day."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidPeriod("period must be a non-empty string such as 2026-11-29")
        value = text.strip()
        tz = zone(timezone)
        try:
            if len(value) == 10:
                day = date.fromisoformat(value)
                with _calendar_edges(cadence, timezone, value):
                    nominal = _local_midnight(day, tz)
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
        period = cls.containing(nominal, cadence, timezone)
        with _calendar_edges(cadence, timezone, value):
            if len(value) == 10 and period.start < nominal and \
                    period.end.astimezone(tz).date() == nominal.date():
                period = cls.containing(period.end, cadence, timezone)
        return period

    @property
    def label(self) -> str:
        """The period start as local ISO time in the period's timezone (for names and logs)."""
        local = self.start.astimezone(zone(self.timezone))
        if local.time() == time(0):
            return local.date().isoformat()
        return local.isoformat(timespec="minutes")
