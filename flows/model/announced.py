"""The rate limits a provider announces on its answers: OpenAI's ``x-ratelimit-*`` headers
(the reset as a duration such as ``6m0s`` or ``12ms``) and Anthropic's
``anthropic-ratelimit-*`` ones (the reset as an RFC 3339 time). A header that does not parse is
ignored, never an error: a provider's bad header must not fail a paid call."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from flows.retry_after import reset_seconds


@dataclass(frozen=True)
class Quota:
    """One announced limit: its size per window, what is left of it and the seconds until it
    is whole again (each None when not announced)."""

    limit: int | None = None
    remaining: int | None = None
    reset_seconds: float | None = None

    @property
    def known(self) -> bool:
        return self.limit is not None or self.remaining is not None


@dataclass(frozen=True)
class Announced:
    """The limits one answer announced: requests, and tokens (OpenAI's total; Anthropic's
    input and output tokens apart, besides its total)."""

    requests: Quota = Quota()
    tokens: Quota = Quota()
    input_tokens: Quota = Quota()
    output_tokens: Quota = Quota()


def _count(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def _until(value: str | None, now: datetime) -> float | None:
    """Seconds until an RFC 3339 time (Anthropic's resets); None when it does not parse."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - now).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _openai(headers: Mapping[str, str], kind: str) -> Quota:
    return Quota(_count(headers.get(f"x-ratelimit-limit-{kind}")),
                 _count(headers.get(f"x-ratelimit-remaining-{kind}")),
                 reset_seconds(headers.get(f"x-ratelimit-reset-{kind}")))


def _anthropic(headers: Mapping[str, str], kind: str, now: datetime) -> Quota:
    prefix = f"anthropic-ratelimit-{kind}"
    return Quota(_count(headers.get(f"{prefix}-limit")), _count(headers.get(f"{prefix}-remaining")),
                 _until(headers.get(f"{prefix}-reset"), now))


def announced_limits(headers: Mapping[str, str], now: datetime) -> Announced | None:
    """The limits ``headers`` announce (header names case-insensitive, as httpx's headers
    are; a plain dict is read as given), or None when they announce none. ``now`` dates
    Anthropic's reset times."""
    found = Announced(
        requests=_first(_openai(headers, "requests"), _anthropic(headers, "requests", now)),
        tokens=_first(_openai(headers, "tokens"), _anthropic(headers, "tokens", now)),
        input_tokens=_anthropic(headers, "input-tokens", now),
        output_tokens=_anthropic(headers, "output-tokens", now),
    )
    quotas = (found.requests, found.tokens, found.input_tokens, found.output_tokens)
    return found if any(q.known for q in quotas) else None


def _first(*quotas: Quota) -> Quota:
    return next((q for q in quotas if q.known), Quota())
