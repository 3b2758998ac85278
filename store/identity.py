"""Run identity: the stable id of one logical run and the fingerprint of its parameters."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from hashlib import sha256
from typing import Any

from store.errors import InvalidIdentity, InvalidInput

SEPARATOR = "|"
MAX_CHARS = {"job": 200, "subject": 500, "version": 100}  # the column sizes in store.models


def require_aware(
    value: datetime, field: str, error: type[InvalidInput] = InvalidIdentity
) -> datetime:
    """Return ``value`` in UTC; a naive datetime is refused because its instant is unknown."""
    if not isinstance(value, datetime):
        raise error(f"{field} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise error(f"{field} must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(UTC)


def has_surrogate(value: str) -> bool:
    """True if ``value`` holds a lone surrogate code point: it has no UTF-8 form, so no
    database, hash or email can take it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _field(value: str, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidIdentity(f"{name} must be a string, got {type(value).__name__}")
    stripped = value.strip()
    if not stripped:
        raise InvalidIdentity(f"{name} must not be empty")
    if SEPARATOR in stripped or any(c in stripped for c in "\r\n\0"):
        raise InvalidIdentity(f"{name} must not contain {SEPARATOR!r}, CR, LF or NUL: {value!r}")
    if has_surrogate(stripped):
        raise InvalidIdentity(f"{name} must be valid Unicode text (it holds a lone surrogate "
                              f"code point): {value!r}")
    if len(stripped) > MAX_CHARS[name]:
        raise InvalidIdentity(f"{name} is longer than {MAX_CHARS[name]} characters")
    return stripped


@dataclass(frozen=True)
class RunIdentity:
    """(job, subject, period_start, version), and which revision of that logical run (0: the
    original), normalized on creation."""

    job: str
    subject: str
    period_start: datetime
    version: str
    revision: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "job", _field(self.job, "job"))
        object.__setattr__(self, "subject", _field(self.subject, "subject"))
        object.__setattr__(self, "version", _field(self.version, "version"))
        start = require_aware(self.period_start, "period_start").replace(microsecond=0)
        object.__setattr__(self, "period_start", start)
        if isinstance(self.revision, bool) or not isinstance(self.revision, int) \
                or self.revision < 0:
            raise InvalidIdentity(f"revision must be an integer of 0 or more, got "
                                  f"{self.revision!r}")

    @cached_property
    def run_id(self) -> str:
        """sha256 of the normalized identity: stripped fields, period start in UTC, ISO seconds;
        a revision N > 0 appends ``rN`` (a fifth field, which no 4-field identity can spell:
        fields never hold the separator), so revision 0 keeps the id it always had."""
        start = self.period_start.isoformat(timespec="seconds")
        parts = [self.job, self.subject, start, self.version]
        if self.revision:
            parts.append(f"r{self.revision}")
        return sha256(SEPARATOR.join(parts).encode("utf-8")).hexdigest()

    def revised(self, revision: int) -> RunIdentity:
        """The same logical run at another revision."""
        return replace(self, revision=revision)


def run_key(job: str, subject: str, period_start: datetime, version: str) -> str:
    """The stable id of the logical run (job, subject, period_start, version)."""
    return RunIdentity(job, subject, period_start, version).run_id


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def canonical_json(value: Any, what: str = "value") -> str:
    """JSON with sorted keys and no spaces, so equal values give equal bytes."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be JSON-serializable: {exc}") from exc
    except RecursionError as exc:
        raise InvalidInput(f"{what} is nested too deeply to store") from exc
    # PostgreSQL's jsonb cannot store NUL; refuse it on both dialects alike.
    if "\\u0000" in text and _has_nul(value):
        raise InvalidInput(f"{what} must not contain NUL characters")
    if has_surrogate(text):
        raise InvalidInput(f"{what} must be valid Unicode text: a string in it holds a lone "
                           "surrogate code point")
    return text


def document_digest(value: Any, what: str = "document") -> str:
    """sha256 of a JSON document's canonical JSON: equal documents, equal digests (a stored raw
    input's digest is the Run's input version)."""
    return sha256(canonical_json(value, what).encode("utf-8")).hexdigest()


def params_fingerprint(params: dict[str, Any] | None) -> str:
    """sha256 of the canonical JSON of the parameters that shape a Run's output."""
    if params is not None and not isinstance(params, dict):
        raise InvalidInput(f"params must be a dict, got {type(params).__name__}")
    return document_digest(params or {}, "params")


def message_key(run_id: str, channel: str, recipient: str) -> str:
    """Stable idempotency key of one outbox message: the same on every delivery attempt."""
    return sha256(SEPARATOR.join([run_id, channel, recipient]).encode("utf-8")).hexdigest()
