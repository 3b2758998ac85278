"""Reading a server's "try again later" hint, shared by the model client and the mail provider."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), if any; an
    infinite or NaN number ("1e999", "nan") is no hint at all."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def reset_seconds(value: str | None) -> float | None:
    """Seconds until a rate limit resets from an ``x-ratelimit-reset-*`` header: a duration as
    OpenAI writes it ("1s", "6m0s", "20ms", "1h2m3.5s") or plain seconds ("0.5"); anything
    else is no hint."""
    if not value:
        return None
    text = value.strip().lower()
    parts = _DURATION.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        try:
            seconds = float(text)
        except ValueError:
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def pause_hint(headers: Mapping[str, str]) -> float | None:
    """How long a refusing provider asks to be left alone: its Retry-After, else the longest
    of its ``x-ratelimit-reset-requests`` / ``-tokens`` (None: no hint)."""
    given = retry_after_seconds(headers.get("Retry-After"))
    if given is not None:
        return given
    resets = [s for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
              if (s := reset_seconds(headers.get(name))) is not None]
    return max(resets) if resets else None
