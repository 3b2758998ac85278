"""What each channel accepts as a target and a payload, checked when a message is queued (never
at send time): an unknown channel, a payload that is not JSON, a bad endpoint name or object key
is refused with an error naming the fix, and nothing is written."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from store.errors import InvalidMessage
from store.identity import has_surrogate

EMAIL, WEBHOOK, OBJECT = "email", "webhook", "object"
CHANNELS = (EMAIL, WEBHOOK, OBJECT)
# A Prefect block name: lowercase letters, digits and dashes.
_BLOCK_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
MAX_TARGET_CHARS = 1024 + 64  # an S3 key (1024 bytes) behind its bucket block's name
MAX_OBJECT_KEY_BYTES = 1024
_KEY_FORBIDDEN = re.compile("[\x00-\x1f\x7f\\\\]")
CONTENT_TYPES = ("application/json", "text/markdown", "text/plain", "text/csv", "text/html")


def check_channel(channel: object) -> str:
    """A known channel name."""
    if channel not in CHANNELS:
        raise InvalidMessage(f"channel must be one of {', '.join(CHANNELS)}, got {channel!r}")
    return str(channel)


def check_block_name(name: object, what: str) -> str:
    """A Prefect block name (lowercase letters, digits, dashes)."""
    if not isinstance(name, str) or not _BLOCK_NAME.match(name):
        raise InvalidMessage(
            f"{what} must be the name of a Prefect block (lowercase letters, digits and dashes), "
            f"got {name!r}")
    return name


def check_object_key(key: object) -> str:
    """An object key that stays inside its bucket folder: no leading '/', no '.' or '..'
    segment, no empty segment, no control character or backslash, at most 1024 bytes."""
    if not isinstance(key, str) or not key:
        raise InvalidMessage(f"the object key must be a non-empty string, got {key!r}")
    if key.startswith("/"):
        raise InvalidMessage(f"the object key must not start with '/' (it is relative to the "
                             f"bucket's folder): {key!r}")
    segments = key.split("/")
    if any(s in (".", "..") for s in segments):
        raise InvalidMessage(f"the object key must not contain a '.' or '..' segment: {key!r}")
    if any(not s for s in segments[:-1]) or not segments[-1]:
        raise InvalidMessage(f"the object key must not contain '//' or end with '/': {key!r}")
    if _KEY_FORBIDDEN.search(key) or has_surrogate(key):
        raise InvalidMessage(f"the object key must not contain control characters, backslashes "
                             f"or lone surrogates: {key!r}")
    if len(key.encode("utf-8")) > MAX_OBJECT_KEY_BYTES:
        raise InvalidMessage(f"the object key is longer than {MAX_OBJECT_KEY_BYTES} bytes")
    return key


def object_target(bucket: str, key: str) -> str:
    """The target of an object write: its bucket block's name, '/', the key."""
    return f"{check_block_name(bucket, 'the bucket block')}/{check_object_key(key)}"


def split_object_target(target: str) -> tuple[str, str]:
    """(bucket block name, object key) of an object write's target."""
    bucket, _, key = target.partition("/")
    return check_block_name(bucket, "the bucket block"), check_object_key(key)


def canonical_json(payload: Mapping[str, Any]) -> bytes:
    """The payload as compact, key-sorted UTF-8 JSON: equal payloads give equal bytes on every
    attempt, so a receiver never sees one key with two bodies."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def revised_target(channel: str, target: str, number: int) -> str:
    """A revision's target: an object key gets ``.revision-N`` before its extension (a written
    object is never overwritten, so a revision's report goes beside the first); other targets
    stay (the revision's messages have keys of their own)."""
    if channel != OBJECT:
        return target
    head, slash, name = target.rpartition("/")
    stem, dot, extension = name.rpartition(".")
    revised = f"{stem}.revision-{number}.{extension}" if dot and stem else f"{name}.revision-{number}"
    return f"{head}{slash}{revised}"


def check_json_payload(payload: object, what: str = "payload") -> dict[str, Any]:
    """A JSON object (dict of str keys; values JSON types, finite numbers, valid Unicode),
    returned as a copy so that later changes by the caller do not reach the outbox."""
    if not isinstance(payload, Mapping):
        raise InvalidMessage(f"the {what} must be a JSON object (a dict), got "
                             f"{type(payload).__name__}")
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"the {what} is not JSON: {exc}") from None
    if has_surrogate(text):
        raise InvalidMessage(f"the {what} must be valid Unicode text (it holds a lone surrogate)")
    value: dict[str, Any] = json.loads(text)
    return value


def check_object_payload(payload: Mapping[str, Any]) -> None:
    """An object write's payload: ``body`` (the report's text) and its ``content_type``."""
    body, content_type = payload.get("body"), payload.get("content_type")
    if set(payload) != {"body", "content_type"}:
        raise InvalidMessage(f"an object write's payload has exactly 'body' and 'content_type', "
                             f"got {sorted(payload)}")
    if not isinstance(body, str):
        raise InvalidMessage(f"an object write's body must be a string, got {type(body).__name__}")
    if content_type not in CONTENT_TYPES:
        raise InvalidMessage(f"an object write's content_type must be one of "
                             f"{', '.join(CONTENT_TYPES)}, got {content_type!r}")
