"""The rate limits providers announce in their answers' headers, parsed or ignored."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from flows.model.announced import Quota, announced_limits

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def test_openai_headers_give_requests_and_tokens_with_duration_resets() -> None:
    """OpenAI's x-ratelimit-* headers give both limits, their remainders and resets."""
    headers = httpx.Headers({
        "X-RateLimit-Limit-Requests": "600", "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms", "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149000", "x-ratelimit-reset-tokens": "6m0s"})
    found = announced_limits(headers, NOW)
    assert found is not None
    assert (found.requests.limit, found.requests.remaining) == (600, 599)
    assert found.requests.reset_seconds == pytest.approx(0.1)
    assert found.tokens == Quota(150000, 149000, 360.0)
    assert not found.input_tokens.known and not found.output_tokens.known


def test_anthropic_headers_give_each_limit_with_rfc3339_resets() -> None:
    """Anthropic's anthropic-ratelimit-* headers give requests, tokens, input and output."""
    headers = httpx.Headers({
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-12-05T12:00:01Z",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": "2026-12-05T12:00:30+00:00",
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "7990",
        "anthropic-ratelimit-output-tokens-reset": "2026-12-05T12:00:06Z",
        "anthropic-ratelimit-tokens-limit": "48000",
        "anthropic-ratelimit-tokens-remaining": "46990",
        "anthropic-ratelimit-tokens-reset": "2026-12-05T12:00:06Z"})
    found = announced_limits(headers, NOW)
    assert found is not None
    assert found.requests == Quota(50, 49, 1.0)
    assert found.input_tokens == Quota(40000, 39000, 30.0)
    assert found.output_tokens == Quota(8000, 7990, 6.0)
    assert found.tokens == Quota(48000, 46990, 6.0)


def test_an_answer_without_limit_headers_announces_nothing() -> None:
    """No rate-limit header at all: nothing announced."""
    assert announced_limits(httpx.Headers({"content-type": "application/json"}), NOW) is None


@pytest.mark.parametrize("value", ["", "lots", "-5", "1e3", "NaN"])
def test_a_count_that_does_not_parse_is_ignored(value: str) -> None:
    """A garbage or negative count is left unknown, never an error."""
    headers = {"x-ratelimit-limit-requests": value, "x-ratelimit-remaining-requests": "7"}
    found = announced_limits(headers, NOW)
    assert found is not None
    assert found.requests == Quota(None, 7, None)


@pytest.mark.parametrize("value", ["soon", "6 minutes", "2026-13-45T00:00:00Z", "inf"])
def test_a_reset_that_does_not_parse_is_ignored(value: str) -> None:
    """A reset neither a duration nor an RFC 3339 time is left unknown."""
    headers = {"x-ratelimit-limit-requests": "10", "x-ratelimit-reset-requests": value,
               "anthropic-ratelimit-tokens-limit": "10", "anthropic-ratelimit-tokens-reset": value}
    found = announced_limits(headers, NOW)
    assert found is not None
    assert found.requests.reset_seconds is None
    assert found.tokens.reset_seconds is None


def test_a_reset_in_the_past_is_zero_seconds_away() -> None:
    """A reset time already passed means the limit is whole now."""
    headers = {"anthropic-ratelimit-requests-limit": "5",
               "anthropic-ratelimit-requests-reset": "2026-12-05T11:59:00Z"}
    found = announced_limits(headers, NOW)
    assert found is not None and found.requests.reset_seconds == 0.0
