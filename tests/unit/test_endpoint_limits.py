"""An endpoint's shared limits without a database: how long a refused acquisition waits (on
the database clock it returned), bad limits and estimates, the provider's pause hints, named
endpoints and how many subjects a tick runs at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from flows.jobs.budget import Budget, Estimator
from flows.model import DEFAULT, call_bound, endpoint_named
from flows.model.bound import byte_bound
from flows.prices import PriceList
from flows.retry_after import pause_hint, reset_seconds
from flows.run_job.tick import Tick
from flows.settings import EndpointSettings, RunledgerSettings
from store import InvalidInput, Limits, Slot
from store.endpoint_limits import SlotDecision

NOW = datetime(2026, 12, 3, 17, tzinfo=UTC)


def throttle(**given: object) -> SlotDecision:
    fields: dict[str, object] = {
        "granted": False, "now": NOW, "paused_until": None, "rate": None, "request_level": 0.0,
        "tokens_per_minute": None, "token_level": 0.0, "tokens": 100}
    fields.update(given)
    return SlotDecision(**fields)  # type: ignore[arg-type]


def test_a_granted_acquisition_waits_for_nothing() -> None:
    """Granted: no wait, whatever the levels say."""
    assert throttle(granted=True, rate=60.0, request_level=0.0).wait_seconds(0.05) == 0.0


def test_a_paused_endpoint_waits_until_the_pause_ends_on_the_database_clock() -> None:
    """Paused until now + 3 s: wait 3 s, even with full buckets."""
    paused = throttle(paused_until=NOW + timedelta(seconds=3), rate=600.0, request_level=10.0)
    assert paused.wait_seconds(0.05) == 3.0


def test_an_empty_request_bucket_waits_for_its_next_request() -> None:
    """A quarter of a request left at 60 per minute: three quarters of a second."""
    assert throttle(rate=60.0, request_level=0.25).wait_seconds(0.05) == pytest.approx(0.75)


def test_a_short_token_bucket_waits_for_the_calls_tokens() -> None:
    """60,000 tokens a minute (1,000 a second), 400 held, 1,000 needed: 0.6 s."""
    short = throttle(tokens_per_minute=60_000, token_level=400.0, tokens=1_000)
    assert short.wait_seconds(0.05) == pytest.approx(0.6)


def test_a_call_larger_than_a_bucket_waits_only_for_a_full_bucket() -> None:
    """A call of 5,000 tokens against 1,000 a second needs the bucket full (1,000), not 5,000:
    it then runs into debt, which the next calls wait out."""
    large = throttle(tokens_per_minute=60_000, token_level=500.0, tokens=5_000)
    assert large.wait_seconds(0.05) == pytest.approx(0.5)


def test_the_longer_of_two_short_buckets_decides() -> None:
    """Requests short by 0.1 s, tokens by 0.5 s: 0.5 s."""
    both = throttle(rate=600.0, request_level=0.0, tokens_per_minute=60_000, token_level=500.0,
                    tokens=1_000)
    assert both.wait_seconds(0.05) == pytest.approx(0.5)


def test_only_too_many_calls_in_flight_polls() -> None:
    """Buckets full, not paused, yet refused: the calls in flight are too many; poll."""
    assert throttle(rate=600.0, request_level=5.0).wait_seconds(0.05) == 0.05


def test_a_pause_that_already_ended_is_no_wait() -> None:
    """A pause that ended before ``now`` does not count."""
    ended = throttle(paused_until=NOW - timedelta(seconds=1))
    assert ended.wait_seconds(0.2) == 0.2


@pytest.mark.parametrize("given", [
    {"requests_per_minute": 0}, {"requests_per_minute": -5.0},
    {"requests_per_minute": float("nan")}, {"requests_per_minute": float("inf")},
    {"tokens_per_minute": 0}, {"tokens_per_minute": 10.5}, {"max_concurrent": 0},
    {"max_concurrent": True},
])
def test_limits_of_zero_or_less_are_refused(given: dict[str, object]) -> None:
    """A limit is a number greater than 0 (tokens and calls whole), or None."""
    with pytest.raises(InvalidInput, match="endpoint's"):
        Limits(**given)  # type: ignore[arg-type]


def test_an_acquisition_needs_a_name_and_a_whole_estimate() -> None:
    """An empty endpoint name or a negative estimate is refused."""
    with pytest.raises(InvalidInput, match="endpoint's name"):
        Slot("", 10, 60.0)
    with pytest.raises(InvalidInput, match="token estimate"):
        Slot("default", -1, 60.0)


@pytest.mark.parametrize("field", ["model_requests_per_minute", "model_tokens_per_minute",
                                   "model_max_concurrent"])
def test_settings_refuse_limits_of_zero(field: str) -> None:
    """RUNLEDGER_MODEL_REQUESTS_PER_MINUTE=0 and the like are settings errors."""
    overrides: dict[str, Any] = {field: 0}
    with pytest.raises(ValidationError, match="greater than 0"):
        RunledgerSettings(**overrides)


def test_a_named_endpoint_refuses_limits_of_zero() -> None:
    """An endpoint of RUNLEDGER_ENDPOINTS with requests_per_minute=0 is refused."""
    with pytest.raises(ValidationError, match="greater than 0"):
        EndpointSettings(base_url="http://x/v1", model_name="m", requests_per_minute=0)


@pytest.mark.parametrize("value, seconds", [
    ("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0.5", 0.5),
    ("soon", None), ("", None), (None, None), ("1e999", None), ("-3", 0.0),
])
def test_a_rate_limit_reset_header_reads_as_seconds(value: str | None,
                                                    seconds: float | None) -> None:
    """OpenAI's durations and plain seconds read; garbage is no hint."""
    assert reset_seconds(value) == seconds


def test_retry_after_wins_over_the_reset_headers_and_the_longest_reset_counts() -> None:
    """Retry-After first; else the longest of the requests and tokens resets."""
    assert pause_hint({"Retry-After": "3", "x-ratelimit-reset-requests": "9s"}) == 3.0
    assert pause_hint({"x-ratelimit-reset-requests": "2s",
                       "x-ratelimit-reset-tokens": "1m"}) == 60.0
    assert pause_hint({"Retry-After": "garbage"}) is None


def test_a_budget_in_tokens_and_the_endpoint_limits_take_the_same_bound() -> None:
    """The tokens a call reserves in a budget are its bound, what its endpoint's limits take."""
    budget = Budget(per_period=10_000, unit="tokens")
    spend = Estimator("j", budget, PriceList(), NOW, NOW)
    bound = call_bound("m", "x" * 400, None, 100)
    assert spend.charge("m", bound).estimate == bound.tokens == byte_bound(["x" * 400]) + 100


def test_the_default_endpoint_is_the_model_settings_and_the_offline_model_is_unlimited() -> None:
    """``default``: RUNLEDGER_MODEL*; offline has no limits, openai's come from settings."""
    assert endpoint_named(DEFAULT, RunledgerSettings()).limits is None
    openai = endpoint_named(DEFAULT, RunledgerSettings(
        model="openai", model_base_url="http://127.0.0.1:9/v1", model_name="m",
        model_requests_per_minute=600, model_max_concurrent=16))
    assert openai.limits == Limits(600, None, 16)


def test_a_named_endpoint_comes_from_the_endpoints_setting() -> None:
    """RUNLEDGER_ENDPOINTS names an endpoint with its own model, timeout and limits."""
    settings = RunledgerSettings(endpoints={"fast": EndpointSettings(
        base_url="http://127.0.0.1:9/v1", model_name="small", tokens_per_minute=90_000,
        timeout_seconds=5)})
    fast = endpoint_named("fast", settings)
    assert (fast.limits, fast.timeout_seconds) == (Limits(None, 90_000, None), 5)
    model = fast.model()
    try:
        assert (model.name, model.endpoint) == ("small", "http://127.0.0.1:9/v1")
    finally:
        model.close()


@pytest.mark.parametrize("set_concurrency, endpoint_allows, threads", [
    (None, None, 8), (None, 64, 64), (4, 64, 4), (12, None, 12),
])
def test_a_tick_runs_as_many_subjects_as_its_endpoint_allows_unless_told(
        set_concurrency: int | None, endpoint_allows: int | None, threads: int) -> None:
    """The endpoint's max concurrent sizes the tick; RUNLEDGER_SUBJECT_CONCURRENCY wins."""
    settings = (RunledgerSettings() if set_concurrency is None
                else RunledgerSettings(subject_concurrency=set_concurrency))
    tick = Tick(None, None, None, None, PriceList(), None, settings,  # type: ignore[arg-type]
                "flow-run", endpoint_concurrency=endpoint_allows)
    assert tick.subject_concurrency == threads
