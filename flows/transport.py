"""What every transport of every channel promises (as httpx's ``_transports/base.py`` is for
its transports): render a claimed outbox message, send it, and say in one ``SendOutcome`` what
the ledger does next; before another attempt, ask the receiver whether an earlier one arrived,
where it can say. Each channel's transport maps its own protocol's replies (SMTP codes, HTTP
statuses, S3 error codes) onto the four outcome kinds. Configuration problems are raised as
``DeliveryConfigurationError`` instead."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from flows.retry_after import retry_after_seconds
from store import MessageClaim, Reply, canonical_json

T = TypeVar("T")


class OutcomeKind(StrEnum):
    """How a send ended, as far as the sender can know, named by what the ledger does next."""

    SENT = "sent"  # the receiver has it: mark the message sent
    TRANSIENT = "transient"  # not accepted, may work later: retry after a backoff
    PERMANENT = "permanent"  # refused for good: the message is dead
    AMBIGUOUS = "ambiguous"  # lost after the data was handed over: uncertain, the receiver may have it


@dataclass(frozen=True)
class SendOutcome:
    """One classified send result. ``retry_after`` is the receiver's own wait hint in seconds;
    ``unreachable`` says the transport could not reach the receiver at all (end the pass);
    ``settled``, that the receiver was asked about an earlier attempt instead of sent to."""

    kind: OutcomeKind
    reply: Reply = field(default_factory=Reply)
    error: str | None = None
    retry_after: float | None = None
    unreachable: bool = False
    settled: bool = False

    @property
    def summary(self) -> str:
        """The reply or error in one line, for the ledger's last_error and the attempt row."""
        if self.error:
            return self.error
        if self.reply.code is not None:
            return f"{self.reply.code} {self.reply.text or ''}".strip()
        return self.kind.value


class Transport(Protocol[T]):
    """A connection to the receivers of one channel (an SMTP server, an HTTP email provider,
    webhook endpoints, buckets), reused for a pass."""

    name: str
    channel: str

    def render(self, claim: MessageClaim) -> T:
        """What this transport sends for the claimed message: the same on every attempt."""
        ...

    @property
    def key_retention_seconds(self) -> float | None:
        """How long the receiver dedupes a repeated key, or None if it promises nothing."""
        ...

    @property
    def send_reserve_seconds(self) -> float:
        """The longest one send can take before its timeouts fire."""
        ...

    async def send(self, item: T) -> SendOutcome: ...

    async def settle(self, item: T) -> SendOutcome | None:
        """Before another attempt: SENT if the receiver says it has the message (no resend),
        None to send it (never seen, or the receiver offers no lookup), any other outcome to
        record without sending (the receiver cannot say now)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Parcel:
    """What a JSON-payload transport (a webhook, an object write) delivers for one outbox
    message, as a Letter is for email."""

    key: str
    channel: str
    target: str
    payload: Mapping[str, Any]
    created_at: datetime

    @classmethod
    def from_claim(cls, claim: MessageClaim) -> Parcel:
        return cls(key=claim.message_id, channel=claim.channel, target=claim.recipient,
                   payload=claim.payload or {}, created_at=claim.created_at)

    def body(self) -> bytes:
        return canonical_json(self.payload)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or an HTTP date), else ``ratelimit-reset``."""
    for name in ("retry-after", "ratelimit-reset"):
        seconds = retry_after_seconds(headers.get(name))
        if seconds is not None:
            return seconds
    return None


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; names are not resolved (a DNS answer could
    lie). Only a loopback receiver may be reached in plain text."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
