"""Fuzzed periods: Period.parse, the run-job flow's ``period`` parameter and cadences/timezones
either give a Period or raise InvalidPeriod with a message, never another exception."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from flows.registry import get_job
from flows.run_job.flow import nominal_period
from store import Period
from store.errors import InvalidPeriod
from tests.support.fuzz import FUZZ, hostile_text, refused, works_or_refused

CADENCES = ["hourly", "daily", "weekly", "monthly", "0 7 * * *", "30 2 * * *", "*/15 * * * *",
            "0 0 29 2 *", "0 0 31 2 *", "0 0 1 1 *", "5 4 * * sun"]
ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Pacific/Kiritimati",
         "America/Santiago", "Asia/Kathmandu"]
offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
instants = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59),
                        timezones=offsets | st.just(UTC))
period_texts = (
    hostile_text
    | st.dates().map(date.isoformat)
    | instants.map(lambda d: d.isoformat())
    | instants.map(lambda d: d.replace(tzinfo=None).isoformat())
    | instants.map(lambda d: d.isoformat().replace("+00:00", "Z"))
    | st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9:.]{0,12}([+-][0-9:]{0,8}|Z)?)?\Z")
)


@FUZZ
@given(text=period_texts, cadence=st.sampled_from(CADENCES) | hostile_text,
       tz=st.sampled_from(ZONES) | hostile_text)
@example(text="9999-12-31", cadence="monthly", tz="UTC")
@example(text="9999-12-31T23:59:00+00:00", cadence="weekly", tz="Pacific/Kiritimati")
@example(text="0001-01-01", cadence="daily", tz="America/New_York")
@example(text="0001-01-01T00:00:00+00:00", cadence="0 7 * * *", tz="UTC")
@example(text="2026-02-01", cadence="0 0 31 2 *", tz="UTC")
@example(text="2026-01-01", cadence="daily", tz="Europe/Paris\0")
@example(text="2026-01-01", cadence="daily", tz="../../etc/passwd")
def test_period_parse_gives_a_period_or_an_invalid_period(text: str, cadence: str, tz: str) -> None:
    """Any text, cadence and timezone: a valid half-open UTC period containing the named
    instant, or InvalidPeriod with a message."""
    found = works_or_refused(lambda: Period.parse(text, cadence, tz))
    if refused(found):
        assert isinstance(found, InvalidPeriod)
        return
    assert isinstance(found, Period)
    assert found.start < found.end and found.start.tzinfo is UTC
    assert found.label  # printable in flow run names and logs


@FUZZ
@given(period=period_texts | st.none() | st.integers() | st.floats() | st.lists(st.text()),
       job=st.sampled_from(["competitor-summary", "daily-credit"]))
@example(period=20260105, job="competitor-summary")
@example(period=["2026-01-05"], job="daily-credit")
def test_the_flows_period_parameter_gives_a_period_or_an_invalid_period(period: Any,
                                                                         job: str) -> None:
    """What the UI's Custom run or the API may send as ``period`` (any JSON value, not only a
    string): a Period of the job, or InvalidPeriod with a message."""
    definition = get_job(job)
    if period is None or (isinstance(period, str) and not period.strip()):
        return  # the flow run's own scheduled time: needs a flow run context
    found = works_or_refused(lambda: nominal_period(definition, period))
    assert isinstance(found, Period | InvalidPeriod)


@FUZZ
@given(nominal=instants, cadence=st.sampled_from(CADENCES), tz=st.sampled_from(ZONES))
@example(nominal=datetime(9999, 12, 31, 23, 59, tzinfo=UTC), cadence="monthly", tz="UTC")
@example(nominal=datetime(1, 1, 1, tzinfo=UTC), cadence="daily", tz="America/New_York")
def test_the_period_containing_any_instant_is_a_period_or_an_invalid_period(
        nominal: datetime, cadence: str, tz: str) -> None:
    """At the edges of the calendar a period may not exist: InvalidPeriod, never an
    OverflowError; otherwise it contains the instant."""
    found = works_or_refused(lambda: Period.containing(nominal, cadence, tz))
    if isinstance(found, Period):
        assert found.start <= nominal < found.end


# --- what the fuzzing found (each was another exception before) ------------------------------


def test_a_period_beyond_the_calendar_is_an_invalid_period_not_an_overflow() -> None:
    """Found by fuzzing: the month after December 9999 raised OverflowError."""
    with_message = "no period of cadence 'monthly' in UTC contains 9999-12-31T00:00:00+00:00: " \
                   "it would begin or end outside the years 1 to 9999"
    with pytest.raises(InvalidPeriod) as caught:
        Period.parse("9999-12-31", "monthly", "UTC")
    assert str(caught.value) == with_message
    with pytest.raises(InvalidPeriod, match="outside the years 1 to 9999"):
        Period.parse("0001-01-01T00:00:00+00:00", "0 7 * * *", "UTC")


def test_a_cron_cadence_that_never_fires_is_an_invalid_period() -> None:
    """Found by fuzzing: February 31st made croniter raise CroniterBadDateError."""
    with pytest.raises(InvalidPeriod, match=r"cron cadence '0 0 31 2 \*' does not fire near"):
        Period.parse("2026-02-01", "0 0 31 2 *", "UTC")


def test_a_timezone_name_too_long_for_the_tz_database_is_unknown() -> None:
    """Found by fuzzing: a 2000-character name raised OSError (file name too long)."""
    with pytest.raises(InvalidPeriod, match=r"unknown IANA timezone 'x{100}\.\.\.'"):
        Period.parse("2026-02-01", "daily", "x" * 2000)


def test_a_period_parameter_that_is_not_a_string_is_an_invalid_period() -> None:
    """Found by fuzzing: ``period=20260105`` (a JSON number) raised AttributeError."""
    with pytest.raises(InvalidPeriod, match="period must be a non-empty string such as 2026-11-29"):
        nominal_period(get_job("competitor-summary"), 20260105)  # type: ignore[arg-type]


def test_a_cron_period_near_year_1_is_an_invalid_period() -> None:
    """Found by fuzzing: a leap-day cron near year 4 made dateutil raise ValueError (year 0)."""
    with pytest.raises(InvalidPeriod, match="outside the years 1 to 9999"):
        Period.containing(datetime(4, 1, 1, tzinfo=UTC), "0 0 29 2 *", "UTC")
