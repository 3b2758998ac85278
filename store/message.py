"""OutboxMessage: what a job asks to deliver, validated when it is queued (never at send time)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any

from email_validator import EmailNotValidError, validate_email

from store.channels import (
    EMAIL,
    OBJECT,
    WEBHOOK,
    canonical_json,
    check_block_name,
    check_channel,
    check_json_payload,
    check_object_payload,
    object_target,
    split_object_target,
)
from store.errors import InvalidMessage
from store.identity import has_surrogate

MAX_MESSAGE_BYTES = 256 * 1024  # an email, a webhook's JSON
MAX_OBJECT_BYTES = 5 * 1024 * 1024  # an object write's report
MAX_SUBJECT_CHARS = 998  # RFC 5322 line limit
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


@dataclass(frozen=True)
class OutboxMessage:
    """One effect to deliver once a Run completes; unique per (run, channel, recipient), where
    the recipient is the channel's target. Build webhook and object messages with
    ``OutboxMessage.webhook`` and ``OutboxMessage.object``. ``hold``: queue it held until a
    person approves it, overdue after that long (a job's ``Approval`` sets it)."""

    recipient: str
    subject: str
    body: str
    channel: str = EMAIL
    headers: dict[str, str] = field(default_factory=dict)
    payload: dict[str, Any] | None = None
    hold: timedelta | None = None

    @classmethod
    def webhook(cls, endpoint: str, payload: dict[str, Any],
                subject: str | None = None) -> OutboxMessage:
        """A JSON POST to the webhook endpoint block called ``endpoint``; ``subject`` labels it
        in the CLI (default: the endpoint's name)."""
        return cls(recipient=endpoint, subject=subject or f"webhook {endpoint}", body="",
                   channel=WEBHOOK, payload=payload)

    @classmethod
    def object(cls, bucket: str, key: str, body: str,
               content_type: str = "application/json") -> OutboxMessage:
        """A report written once to ``key`` in the bucket of the S3Bucket block called
        ``bucket`` (under its folder)."""
        return cls(recipient=object_target(bucket, key), subject=f"object {key}"[:200], body="",
                   channel=OBJECT, payload={"body": body, "content_type": content_type})

    def __post_init__(self) -> None:
        check_channel(self.channel)
        check_header_value(self.subject, "subject")
        if not self.subject.strip():
            raise InvalidMessage("subject must not be empty")
        if len(self.subject) > MAX_SUBJECT_CHARS:
            raise InvalidMessage(f"subject is longer than {MAX_SUBJECT_CHARS} characters")
        if not isinstance(self.body, str):
            raise InvalidMessage(f"body must be a string, got {type(self.body).__name__}")
        if "\0" in self.body:
            raise InvalidMessage("body must not contain NUL")
        if has_surrogate(self.body):
            raise InvalidMessage("body must be valid Unicode text (it holds a lone surrogate "
                                 "code point)")
        if not isinstance(self.headers, dict):
            raise InvalidMessage(f"headers must be a dict of header name to value, got "
                                 f"{type(self.headers).__name__}")
        if self.hold is not None and (not isinstance(self.hold, timedelta)
                                      or self.hold <= timedelta(0)):
            raise InvalidMessage(f"hold must be a positive timedelta (how long a person has to "
                                 f"decide), or None to send without approval, got {self.hold!r}")
        if self.channel == EMAIL:
            self._check_email()
        else:
            self._check_effect()

    def _check_email(self) -> None:
        object.__setattr__(self, "recipient", normalize_address(self.recipient))
        if self.payload is not None:
            raise InvalidMessage("an email has a subject and a body, not a payload; use "
                                 "OutboxMessage.webhook or OutboxMessage.object for JSON")
        # A copy: the caller's dict may change after validation (or be shared by messages).
        object.__setattr__(self, "headers", dict(self.headers))
        for name, value in self.headers.items():
            if not isinstance(name, str) or not _HEADER_NAME.match(name):
                raise InvalidMessage(f"header name {name!r} is not a valid RFC 5322 field name")
            if name.lower() in RESERVED_HEADERS:
                raise InvalidMessage(f"header {name!r} is set by the dispatcher, not by a job")
            check_header_value(value, f"header {name}")
        size = self.size_bytes()
        if size > MAX_MESSAGE_BYTES:
            raise InvalidMessage(f"message is {size} bytes, above the {MAX_MESSAGE_BYTES}-byte limit")

    def _check_effect(self) -> None:
        if self.headers or self.body:
            raise InvalidMessage(f"a {self.channel} message carries its content in its payload; "
                                 "headers and body must be empty")
        if self.channel == WEBHOOK:
            check_block_name(self.recipient, "the webhook endpoint")
        else:
            split_object_target(self.recipient)
        payload = check_json_payload(self.payload)
        object.__setattr__(self, "payload", payload)
        limit = MAX_MESSAGE_BYTES
        if self.channel == OBJECT:
            check_object_payload(payload)
            limit = MAX_OBJECT_BYTES
        size = self.size_bytes()
        if size > limit:
            raise InvalidMessage(f"the {self.channel} payload is {size} bytes, above the "
                                 f"{limit}-byte limit")

    def size_bytes(self) -> int:
        parts: list[Any] = [self.subject, self.body, *self.headers.keys(), *self.headers.values()]
        size = sum(len(str(p).encode("utf-8")) for p in parts)
        return size + (len(canonical_json(self.payload)) if self.payload is not None else 0)
