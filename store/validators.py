"""Validators of what callers hand the ledger: each returns the value it accepts, or raises
``InvalidInput`` naming what is wrong, before anything is written."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from store.errors import InvalidInput, OutputTooLarge
from store.identity import canonical_json
from store.models import MAX_OWNER

MAX_SECONDS = 366 * 24 * 3600  # longest lease or delay; SQLite's date functions overflow to NULL


def check_seconds(value: float, name: str = "seconds") -> float:
    """A duration in seconds that both databases' clocks can add (0 to ``MAX_SECONDS``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SECONDS:
        raise InvalidInput(
            f"{name} must be a number of seconds between 0 and {MAX_SECONDS}, got {value!r}"
        )
    return float(value)


def lease_seconds(lease: timedelta | float) -> float:
    """A lease as seconds: a positive timedelta or number of seconds."""
    value = lease.total_seconds() if isinstance(lease, timedelta) else lease
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"lease must be a positive timedelta or number of seconds, got {lease!r}")
    return float(value)


def check_calls(value: int) -> int:
    """A number of model calls: an integer, 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"model_calls must be an integer of 0 or more, got {value!r}")
    return value


def json_document(value: Any, what: str, max_bytes: int) -> dict[str, Any]:
    """A JSON object within ``max_bytes`` when serialized; anything else is refused."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a dict (a JSON object), got {type(value).__name__}")
    size = len(canonical_json(value, what).encode("utf-8"))
    if size > max_bytes:
        raise OutputTooLarge(f"{what} is {size} bytes, above the configured limit of {max_bytes} bytes")
    return value


def error_text(error: str) -> str:
    """A failure's error as storable text: required; NUL (refused by PostgreSQL) and lone
    surrogates (no UTF-8 form) escaped, so that any exception's message can be recorded."""
    if not isinstance(error, str) or not error.strip():
        raise InvalidInput("error must be a non-empty string describing the failure")
    return error.replace("\0", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def check_owner(owner: str) -> str:
    """A lease owner such as host:pid: non-empty text that fits the owner column."""
    if not isinstance(owner, str) or not owner.strip() or "\0" in owner or len(owner) > MAX_OWNER:
        raise InvalidInput(
            f"owner must be a non-empty string such as host:pid, at most {MAX_OWNER} characters "
            f"and without NUL, got {owner!r}"
        )
    return owner


def revision_reason(reason: str) -> str:
    """Why a revision is asked for: required text, storable as an error text is."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("a revision needs a reason: say why the Run's output must be redone "
                           "(e.g. --reason 'recipients changed')")
    return error_text(reason.strip())

