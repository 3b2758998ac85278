"""OutboxMessage: what a job asks to deliver, validated when it is queued (never at send time)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from store.channels import (
    EMAIL,
    OBJECT,
    WEBHOOK,
    Content,
    canonical_json,
    channel_rules,
    check_header_value,
    object_target,
)
from store.errors import InvalidMessage
from store.identity import has_surrogate

MAX_SUBJECT_CHARS = 998  # RFC 5322 line limit


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
        rules = channel_rules(self.channel)
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
        content = rules.check(Content(self.recipient, self.headers, self.body, self.payload))
        object.__setattr__(self, "recipient", content.recipient)
        object.__setattr__(self, "headers", content.headers)
        object.__setattr__(self, "payload", content.payload)
        size = self.size_bytes()
        if size > rules.max_bytes:
            what = "message" if self.payload is None else f"the {self.channel} payload"
            raise InvalidMessage(f"{what} is {size} bytes, above the {rules.max_bytes}-byte limit")

    def size_bytes(self) -> int:
        parts: list[Any] = [self.subject, self.body, *self.headers.keys(), *self.headers.values()]
        size = sum(len(str(p).encode("utf-8")) for p in parts)
        return size + (len(canonical_json(self.payload)) if self.payload is not None else 0)
