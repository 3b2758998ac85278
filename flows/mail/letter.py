"""A Letter is one outbox message rendered for a transport. Everything in it derives from the
stored row, so every attempt sends the same bytes, the same Message-ID and the same key."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from email.charset import QP, Charset
from email.header import Header
from email.utils import format_datetime
from typing import Any

from store import MessageClaim

KEY_HEADER = "X-Idempotency-Key"
# Fixed, never taken from settings: a changed domain would change the Message-ID of a message
# that is already queued or in flight.
MESSAGE_ID_DOMAIN = "runledger"


MAX_LINE = 998  # RFC 5322's hard limit: longer header or 7bit body lines are folded or encoded
_NEWLINE = re.compile(r"\r\n|\r|\n")
UTF8_QP = Charset("utf-8")
UTF8_QP.body_encoding = QP


def _field(name: str, value: str) -> str:
    if value.isascii() and len(name) + 2 + len(value) <= MAX_LINE:
        return f"{name}: {value}"
    encoded = Header(value, "us-ascii" if value.isascii() else "utf-8", header_name=name)
    return f"{name}: {encoded.encode(linesep=chr(13) + chr(10))}"


def message_id_for(key: str) -> str:
    """The Message-ID header of the outbox message whose idempotency key is ``key``."""
    return f"<{key}@{MESSAGE_ID_DOMAIN}>"


@dataclass(frozen=True)
class Letter:
    """What a transport sends for one outbox message."""

    key: str
    sender: str
    recipient: str
    subject: str
    body: str
    date: datetime
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_claim(cls, claim: MessageClaim, sender: str) -> Letter:
        return cls(key=claim.message_id, sender=sender, recipient=claim.recipient,
                   subject=claim.subject, body=claim.body, date=claim.created_at,
                   headers=dict(claim.headers))

    @property
    def message_id(self) -> str:
        return message_id_for(self.key)

    def to_bytes(self) -> bytes:
        """The RFC 5322 message with CRLF line endings. Header values are written as they are
        when ASCII and within the line limit (the outbox refused control characters and encoded words when the
        message was queued) and through the email package's encoder otherwise; this is several
        times faster than building an EmailMessage, which matters at hundreds of messages a second."""
        fields = [
            ("From", self.sender), ("To", self.recipient), ("Subject", self.subject),
            ("Date", format_datetime(self.date, usegmt=True)), ("Message-ID", self.message_id),
            (KEY_HEADER, self.key), *self.headers.items(), ("MIME-Version", "1.0"),
        ]
        if self.body.isascii() and all(len(line) <= MAX_LINE for line in self.body.splitlines()):
            fields += [("Content-Type", 'text/plain; charset="us-ascii"'),
                       ("Content-Transfer-Encoding", "7bit")]
            body = self.body
        else:  # quoted-printable: readable, and no receiver needs 8BITMIME
            fields += [("Content-Type", 'text/plain; charset="utf-8"'),
                       ("Content-Transfer-Encoding", "quoted-printable")]
            body = UTF8_QP.body_encode(self.body) or ""
        head = "\r\n".join(_field(name, value) for name, value in fields)
        return f"{head}\r\n\r\n{_NEWLINE.sub(chr(13) + chr(10), body)}".encode("ascii")

    def provider_payload(self) -> dict[str, Any]:
        """The JSON body of a Resend-style ``POST /emails``; equal on every attempt, so the
        provider never sees one key with two payloads."""
        return {
            "from": self.sender,
            "to": [self.recipient],
            "subject": self.subject,
            "text": self.body,
            "headers": {**self.headers, "Message-ID": self.message_id, KEY_HEADER: self.key},
        }
