"""What an answer's announced limits tell its endpoint's row, decided from the headers and a
given now, without a database: the rate per minute, the window read from the reset, the pause
of a nearly spent quota (capped), and bad headers ignored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from flows.model.announced import announced_limits
from flows.model.limiter import learned
from store import Announcement, InvalidInput

NOW = datetime(2026, 12, 5, 23, 0, 0, tzinfo=UTC)


def from_headers(headers: dict[str, str], max_pause: float = 60.0) -> Announcement | None:
    return learned(announced_limits(httpx.Headers(headers), NOW), max_pause)


def openai(kind: str, limit: str, remaining: str, reset: str) -> dict[str, str]:
    return {f"x-ratelimit-limit-{kind}": limit, f"x-ratelimit-remaining-{kind}": remaining,
            f"x-ratelimit-reset-{kind}": reset}


def test_an_openai_minute_quota_becomes_requests_and_tokens_per_minute() -> None:
    """600 requests and 150,000 tokens a minute, nearly whole: adopted as they are, with what
    is left, and no pause."""
    found = from_headers({**openai("requests", "600", "599", "100ms"),
                          **openai("tokens", "150000", "149000", "400ms")})
    assert found == Announcement(600.0, 150_000, 599, 149_000, None)


def test_a_whole_number_left_near_a_full_quota_is_read_as_a_minute() -> None:
    """10 a minute, 9 left (the 10th was 0.3 taken, rounded down) and a reset of 1.8 s would
    say a window of 18 s: noise, the window stays a minute."""
    found = from_headers(openai("requests", "10", "9", "1.8s"))
    assert found is not None and found.requests_per_minute == 10.0


def test_a_daily_quota_is_read_from_its_reset_as_a_day() -> None:
    """200 a day, 150 left, whole again in 6 h: 200 per 1,440 minutes."""
    found = from_headers(openai("requests", "200", "150", "6h0m0s"))
    assert found is not None
    assert found.requests_per_minute == pytest.approx(200 / 1440)


def test_a_nearly_spent_quota_pauses_until_its_reset() -> None:
    """No request left of 600, whole again in 6 s: pause 6 s; tokens nearly spent (1 % left)
    and resetting later pause until the later reset."""
    found = from_headers(openai("requests", "600", "0", "6s"))
    assert found is not None and found.pause_seconds == 6.0
    both = from_headers({**openai("requests", "600", "0", "6s"),
                         **openai("tokens", "10000", "99", "9s")})
    assert both is not None and both.pause_seconds == 9.0


def test_a_quota_with_more_than_a_sliver_left_does_not_pause() -> None:
    """7 of 600 left (more than 1 %): no pause; 1 of 10 left: no pause either (at least one
    whole request is the least that counts as nearly spent)."""
    for limit, left in (("600", "7"), ("10", "1")):
        found = from_headers(openai("requests", limit, left, "1s"))
        assert found is not None and found.pause_seconds is None


def test_a_pause_is_capped_by_the_longest_pause_allowed() -> None:
    """A quota resetting in a day pauses only as long as RUNLEDGER_MAX_RETRY_AFTER_SECONDS."""
    found = from_headers(openai("requests", "200", "0", "24h0m0s"), max_pause=120.0)
    assert found is not None and found.pause_seconds == 120.0


def test_anthropic_headers_give_the_rate_and_a_pause_dated_by_the_given_now() -> None:
    """Anthropic's requests quota spent, reset 4 s after the given now: 50 a minute and a
    4 s pause; its input and output token quotas apart are not taken as a tokens limit."""
    reset = (NOW + timedelta(seconds=4)).isoformat().replace("+00:00", "Z")
    found = from_headers({
        "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": reset})
    assert found == Announcement(50.0, None, 0, None, 4.0)


@pytest.mark.parametrize("headers", [
    {},
    {"x-ratelimit-limit-requests": "lots", "x-ratelimit-remaining-requests": "-3",
     "x-ratelimit-reset-requests": "soon"},
    {"x-ratelimit-limit-requests": "0"},
    {"x-ratelimit-limit-tokens": "1e999", "anthropic-ratelimit-requests-reset": "tomorrow"},
])
def test_headers_that_announce_nothing_usable_are_ignored(headers: dict[str, str]) -> None:
    """None, empty, unparseable or zero limits: nothing to learn, never an error."""
    assert from_headers(headers) is None


def test_a_remaining_without_a_reset_is_kept_but_pauses_nothing() -> None:
    """0 left and no reset named: what is left is recorded, no pause is guessed."""
    found = from_headers({"x-ratelimit-limit-requests": "600",
                          "x-ratelimit-remaining-requests": "0"})
    assert found == Announcement(600.0, None, 0, None, None)


def test_an_announcement_of_a_negative_or_infinite_value_is_refused() -> None:
    """The ledger's row takes only positive limits and finite amounts of 0 or more."""
    with pytest.raises(InvalidInput):
        Announcement(requests_per_minute=0)
    with pytest.raises(InvalidInput):
        Announcement(pause_seconds=float("inf"))
    with pytest.raises(InvalidInput):
        Announcement(requests_remaining=-1)
