"""The retention's DURATION grammar and its refusals, each naming the setting it meets."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flows.delivery.settings import DeliverySettings
from flows.jobs.competitor_summary import job as competitor_summary
from flows.retention import InvalidDuration, RetentionTooShort, check_retention, parse_duration


@pytest.mark.parametrize(("text", "value"), [
    ("90d", timedelta(days=90)), ("36h", timedelta(hours=36)), ("90m", timedelta(minutes=90)),
    ("1d12h", timedelta(days=1, hours=12)), (" 2D ", timedelta(days=2)),
    ("1d2h3m", timedelta(days=1, hours=2, minutes=3)),
])
def test_a_duration_is_whole_days_hours_and_minutes(text: str, value: timedelta) -> None:
    """Each unit once, largest first; case and surrounding spaces do not matter."""
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["", "90", "30 days", "1.5d", "-3d", "3s", "1w", "12h1d",
                                  "1d1d", "0d", "0h0m", "d"])
def test_anything_else_is_refused_with_the_grammar(text: str) -> None:
    """No bare numbers, fractions, signs, seconds, weeks, repeated or reordered units, zero."""
    with pytest.raises(InvalidDuration, match="--older-than"):
        parse_duration(text)


def test_a_retention_shorter_than_a_jobs_reconcile_window_names_catch_up_window() -> None:
    """The job's own window is named, with the job."""
    with pytest.raises(RetentionTooShort, match=r"competitor-summary.*catch_up_window"):
        check_retention(competitor_summary.catch_up_window - timedelta(minutes=1),
                        [competitor_summary], DeliverySettings())
    check_retention(competitor_summary.catch_up_window, [competitor_summary], DeliverySettings())


def test_a_retention_shorter_than_the_retry_window_or_the_key_retention_names_them() -> None:
    """The delivery retry window and the provider's key retention are named by variable."""
    with pytest.raises(RetentionTooShort, match="RUNLEDGER_DELIVERY_MAX_WINDOW_HOURS"):
        check_retention(timedelta(days=10), [], DeliverySettings(max_window_hours=24 * 11))
    with pytest.raises(RetentionTooShort, match="RUNLEDGER_PROVIDER_KEY_RETENTION_HOURS"):
        check_retention(timedelta(days=10), [], DeliverySettings(),
                        (timedelta(days=11), "RUNLEDGER_PROVIDER_KEY_RETENTION_HOURS"))
    check_retention(timedelta(days=10), [], DeliverySettings(),
                    (timedelta(days=10), "RUNLEDGER_PROVIDER_KEY_RETENTION_HOURS"))
