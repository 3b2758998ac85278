"""Periods: [start, end) in the job's IANA timezone, correct across DST, stored in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from store import Period
from store.errors import InvalidPeriod

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_daily_period_is_local_midnight_to_midnight_in_utc() -> None:
    """A Berlin day in winter is 23:00 UTC to 23:00 UTC."""
    period = Period.containing(utc(2026, 11, 29, 12), "daily", BERLIN)
    assert (period.start, period.end) == (utc(2026, 11, 28, 23), utc(2026, 11, 29, 23))
    assert period.label == "2026-11-29"


def test_daily_period_is_23_hours_on_spring_forward_and_25_on_fall_back() -> None:
    """DST days are shorter or longer in UTC, never shifted."""
    spring = Period.containing(utc(2026, 3, 29, 12), "daily", BERLIN)
    autumn = Period.containing(utc(2026, 10, 25, 12), "daily", BERLIN)
    assert (spring.start, spring.end - spring.start) == (utc(2026, 3, 28, 23), timedelta(hours=23))
    assert (autumn.start, autumn.end - autumn.start) == (utc(2026, 10, 24, 22), timedelta(hours=25))


def test_repeated_fall_back_hour_gives_two_distinct_hourly_periods() -> None:
    """01:30 EDT and 01:30 EST in New York are different hours, so different periods."""
    first = Period.containing(utc(2026, 11, 1, 5, 30), "hourly", NEW_YORK)
    second = Period.containing(utc(2026, 11, 1, 6, 30), "hourly", NEW_YORK)
    assert (first.start, first.end) == (utc(2026, 11, 1, 5), utc(2026, 11, 1, 6))
    assert (second.start, second.end) == (utc(2026, 11, 1, 6), utc(2026, 11, 1, 7))
    assert first.label != second.label


def test_hourly_periods_on_spring_forward_are_contiguous_hours() -> None:
    """The skipped local hour does not exist: 01:00 EST is followed by 03:00 EDT, one hour later."""
    before = Period.containing(utc(2026, 3, 8, 6, 30), "hourly", NEW_YORK)
    after = Period.containing(utc(2026, 3, 8, 7, 30), "hourly", NEW_YORK)
    assert before.end == after.start == utc(2026, 3, 8, 7)
    assert after.end - after.start == timedelta(hours=1)


def test_weekly_period_starts_on_local_monday_and_spans_the_dst_change() -> None:
    """The week containing Berlin's spring-forward Sunday is 167 hours long."""
    period = Period.containing(utc(2026, 3, 29, 12), "weekly", BERLIN)
    assert period.start == utc(2026, 3, 22, 23)
    assert period.end - period.start == timedelta(hours=167)


def test_monthly_period_runs_from_the_first_local_midnight_to_the_next() -> None:
    """March in New York starts in EST and ends in EDT."""
    period = Period.containing(utc(2026, 3, 15), "monthly", NEW_YORK)
    assert (period.start, period.end) == (utc(2026, 3, 1, 5), utc(2026, 4, 1, 4))


def test_cron_hourly_repeats_the_fall_back_hour_like_the_clock() -> None:
    """A wildcard-hour cron fires at both 01:00 EDT and 01:00 EST."""
    second = Period.containing(utc(2026, 11, 1, 6, 30), "0 * * * *", NEW_YORK)
    assert (second.start, second.end) == (utc(2026, 11, 1, 6), utc(2026, 11, 1, 7))
    first = Period.containing(utc(2026, 11, 1, 5, 30), "0 * * * *", NEW_YORK)
    assert first.end == second.start


def test_cron_fixed_time_in_the_repeated_hour_fires_once() -> None:
    """A daily 01:30 job fires at the first 01:30 only: that day's period is 25 hours."""
    period = Period.containing(utc(2026, 11, 1, 6, 45), "30 1 * * *", NEW_YORK)
    assert (period.start, period.end) == (utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30))


def test_cron_time_skipped_by_spring_forward_fires_shifted_by_the_gap() -> None:
    """02:30 does not exist on 2026-03-08 in New York: the run is at 03:30 EDT."""
    period = Period.containing(utc(2026, 3, 8, 12), "30 2 * * *", NEW_YORK)
    assert (period.start, period.end) == (utc(2026, 3, 8, 7, 30), utc(2026, 3, 9, 6, 30))


@pytest.mark.parametrize("cadence", ["hourly", "daily", "weekly", "monthly", "*/20 * * * *", "30 2 * * *"])
@pytest.mark.parametrize("zone", [BERLIN, NEW_YORK])
def test_periods_tile_time_without_gaps_or_overlaps_across_dst(cadence: str, zone: str) -> None:
    """Walking period after period through both DST changes of 2026, each contains its nominal
    time and starts where the previous one ended."""
    for begin in (utc(2026, 3, 7), utc(2026, 10, 24)):
        period = Period.containing(begin, cadence, zone)
        for _ in range(200 if cadence != "monthly" else 3):
            following = Period.containing(period.end, cadence, zone)
            assert following.start == period.end
            middle = following.start + (following.end - following.start) / 2
            assert Period.containing(middle, cadence, zone) == following
            period = following


def test_naive_nominal_time_is_refused() -> None:
    """A naive nominal time is an error, never read as local or UTC."""
    with pytest.raises(InvalidPeriod, match="nominal time must be timezone-aware"):
        Period.containing(datetime(2026, 11, 29, 12), "daily", BERLIN)
    with pytest.raises(InvalidPeriod, match="period start must be timezone-aware"):
        Period(datetime(2026, 11, 29), utc(2026, 11, 30))


def test_unknown_timezone_is_refused() -> None:
    """An unknown IANA name is an error, not a silent UTC."""
    with pytest.raises(InvalidPeriod, match="unknown IANA timezone 'Mars/Olympus'"):
        Period.containing(utc(2026, 11, 29), "daily", "Mars/Olympus")


def test_invalid_cadence_is_refused() -> None:
    """Only the named cadences and 5-field cron expressions are cadences."""
    with pytest.raises(InvalidPeriod, match="cadence must be one of"):
        Period.containing(utc(2026, 11, 29), "fortnightly", BERLIN)


def test_parse_of_a_date_names_that_local_day() -> None:
    """`2026-11-29` for a Berlin daily job is Berlin's 29 November."""
    period = Period.parse("2026-11-29", "daily", BERLIN)
    assert (period.start, period.end) == (utc(2026, 11, 28, 23), utc(2026, 11, 29, 23))


def test_parse_of_a_date_for_a_cron_job_is_the_first_period_starting_that_day() -> None:
    """A daily 02:30 job named by a date means the run starting at 02:30 that day."""
    period = Period.parse("2026-11-29", "30 2 * * *", BERLIN)
    assert period.start == utc(2026, 11, 29, 1, 30)


def test_parse_of_an_offset_datetime_is_the_period_containing_it() -> None:
    """An ISO datetime with an offset (or Z) names the period that contains that instant."""
    assert Period.parse("2026-11-29T00:30:00+01:00", "hourly", BERLIN).start == utc(2026, 11, 28, 23)
    assert Period.parse("2026-11-29T10:15:00Z", "daily", BERLIN).start == utc(2026, 11, 28, 23)


@pytest.mark.parametrize("text", ["2026-11-29T10:00:00", "yesterday", "", "2026-13-01"])
def test_parse_refuses_naive_or_malformed_periods(text: str) -> None:
    """A naive datetime or malformed text is a clear error."""
    with pytest.raises(InvalidPeriod, match="period"):
        Period.parse(text, "daily", BERLIN)


def test_period_end_must_follow_its_start() -> None:
    """An empty or reversed window is refused."""
    with pytest.raises(InvalidPeriod, match="must be after start"):
        Period(utc(2026, 11, 29), utc(2026, 11, 29))
