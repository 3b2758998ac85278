"""The ledger's side of each channel: its name as outbox rows store it, and what it accepts as
a target and a content, checked when a message is queued (never at send time): an unknown
channel, a bad address or header, a payload that is not JSON, a bad endpoint name or object key
is refused with an error naming the fix, and nothing is written. Each channel's rules are one
entry of ``RULES``; its transport is in its folder under ``flows/``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from email_validator import EmailNotValidError, validate_email

from store.errors import InvalidMessage
from store.identity import has_surrogate

EMAIL, WEBHOOK, OBJECT = "email", "webhook", "object"
# A Prefect block name: lowercase letters, digits and dashes.
_BLOCK_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
MAX_TARGET_CHARS = 1024 + 64  # an S3 key (1024 bytes) behind its bucket block's name
MAX_OBJECT_KEY_BYTES = 1024
_KEY_FORBIDDEN = re.compile("[\x00-\x1f\x7f\\\\]")
CONTENT_TYPES = ("application/json", "text/markdown", "text/plain", "text/csv", "text/html")
MAX_MESSAGE_BYTES = 256 * 1024  # an email, a webhook's JSON
MAX_OBJECT_BYTES = 5 * 1024 * 1024  # an object write's report
_HEADER_NAME = re.compile(r"^[!-9;-~]+$")  # printable ASCII except ':' (RFC 5322 ftext)
# CR, LF and NUL, plus every other character that str.splitlines() (used when Python's email
# package folds headers) treats as a line break, and the remaining C0 controls except TAB.
_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")
_ENCODED_WORD = re.compile(r"=\?[^?]*\?[bqBQ]\?", re.ASCII)
# Headers the dispatcher owns: a job may not set them.
RESERVED_HEADERS = frozenset(
    h.lower() for h in ("From", "To", "Cc", "Bcc", "Subject", "Message-ID", "Date",
                        "X-Idempotency-Key", "Content-Type", "Content-Transfer-Encoding",
                        "MIME-Version", "Sender", "Return-Path")
)


def check_header_value(value: str, what: str) -> str:
    """Reject CR, LF, NUL, other line breaks and controls, and RFC 2047 encoded words: each can
    inject a header on Python 3.11.7."""
    if not isinstance(value, str):
        raise InvalidMessage(f"{what} must be a string, got {type(value).__name__}")
    bad = _FORBIDDEN.search(value)
    if bad:
        raise InvalidMessage(
            f"{what} must not contain CR, LF, NUL or another control or line-break character "
            f"(found {bad.group()!r}): {value!r}"
        )
    if _ENCODED_WORD.search(value):
        raise InvalidMessage(f"{what} must not contain an RFC 2047 encoded word (=?...?=): {value!r}")
    if has_surrogate(value):
        raise InvalidMessage(f"{what} must be valid Unicode text (it holds a lone surrogate code "
                             f"point): {value!r}")
    return value


def normalize_address(address: str, what: str = "recipient") -> str:
    """A syntactically valid email address, normalized to ASCII (an internationalized domain
    becomes its IDNA form; a non-ASCII local part, which needs SMTPUTF8, is refused). No
    deliverability lookup."""
    if not isinstance(address, str) or not address.strip():
        raise InvalidMessage(f"{what} must be a non-empty email address")
    check_header_value(address, what)
    try:
        return _normalized(address.strip())
    except EmailNotValidError as exc:
        raise InvalidMessage(f"{what} {address!r} is not a valid email address: {exc}") from exc


@lru_cache(maxsize=4096)
def _normalized(address: str) -> str:
    # Cached: the same recipients come back every period, and validation is pure but not cheap.
    valid = validate_email(address, check_deliverability=False, allow_smtputf8=False)
    return valid.ascii_email or valid.normalized


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


@dataclass(frozen=True)
class Content:
    """What a message carries besides its subject: its target, headers, body and payload."""

    recipient: str
    headers: dict[str, str]
    body: str
    payload: dict[str, Any] | None


def email_content(content: Content) -> Content:
    """An email: a valid address, no payload, valid header names and values none of which the
    dispatcher owns."""
    recipient = normalize_address(content.recipient)
    if content.payload is not None:
        raise InvalidMessage("an email has a subject and a body, not a payload; use "
                             "OutboxMessage.webhook or OutboxMessage.object for JSON")
    # A copy: the caller's dict may change after validation (or be shared by messages).
    headers = dict(content.headers)
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise InvalidMessage(f"header name {name!r} is not a valid RFC 5322 field name")
        if name.lower() in RESERVED_HEADERS:
            raise InvalidMessage(f"header {name!r} is set by the dispatcher, not by a job")
        check_header_value(value, f"header {name}")
    return Content(recipient, headers, content.body, None)


def _payload_only(channel: str, content: Content) -> None:
    if content.headers or content.body:
        raise InvalidMessage(f"a {channel} message carries its content in its payload; "
                             "headers and body must be empty")


def webhook_content(content: Content) -> Content:
    """A webhook: an endpoint block's name, a JSON object payload, no headers or body."""
    _payload_only(WEBHOOK, content)
    check_block_name(content.recipient, "the webhook endpoint")
    return Content(content.recipient, {}, "", check_json_payload(content.payload))


def object_content(content: Content) -> Content:
    """An object write: a bucket block's name and a key, a payload of ``body`` and
    ``content_type``, no headers or body."""
    _payload_only(OBJECT, content)
    split_object_target(content.recipient)
    payload = check_json_payload(content.payload)
    check_object_payload(payload)
    return Content(content.recipient, {}, "", payload)


def same_target(target: str, number: int) -> str:
    """A revision's messages keep their targets (they have keys of their own)."""
    return target


def revised_object_target(target: str, number: int) -> str:
    """An object key gets ``.revision-N`` before its extension: a written object is never
    overwritten, so a revision's report goes beside the first."""
    head, slash, name = target.rpartition("/")
    stem, dot, extension = name.rpartition(".")
    revised = f"{stem}.revision-{number}.{extension}" if dot and stem else f"{name}.revision-{number}"
    return f"{head}{slash}{revised}"


@dataclass(frozen=True)
class ChannelRules:
    """What the ledger checks of one channel's messages: ``check`` returns the content checked
    (copies, normalized), ``max_bytes`` bounds its size, ``revise`` gives a revision's target."""

    check: Callable[[Content], Content]
    max_bytes: int
    revise: Callable[[str, int], str] = same_target


# One entry per channel, in the order people read them.
RULES: dict[str, ChannelRules] = {
    EMAIL: ChannelRules(email_content, MAX_MESSAGE_BYTES),
    WEBHOOK: ChannelRules(webhook_content, MAX_MESSAGE_BYTES),
    OBJECT: ChannelRules(object_content, MAX_OBJECT_BYTES, revised_object_target),
}
CHANNELS = tuple(RULES)


def channel_rules(channel: object) -> ChannelRules:
    """The rules of a known channel."""
    if not isinstance(channel, str) or channel not in RULES:
        raise InvalidMessage(f"channel must be one of {', '.join(CHANNELS)}, got {channel!r}")
    return RULES[channel]


def revised_target(channel: str, target: str, number: int) -> str:
    """A revision's target, by its channel's rule."""
    return channel_rules(channel).revise(target, number)
