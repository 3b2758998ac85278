"""What every transport of every channel promises: render a claimed outbox message (a Letter for
email, a Parcel for a webhook or an object write), send it, and say, in one classified outcome,
what the receiver did with it; and, before another attempt, ask the receiver whether an earlier
one arrived, where the receiver can say. Configuration problems are raised as
``DeliveryConfigurationError`` instead."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from flows.mail.letter import Letter
from store import MessageClaim, Reply, canonical_json

T = TypeVar("T")


class OutcomeKind(StrEnum):
    """How a send ended, as far as the sender can know."""

    SENT = "sent"  # the receiver accepted it
    TRANSIENT = "transient"  # not accepted, may work later (4xx, connect error, rate limit)
    PERMANENT = "permanent"  # refused for good (5xx, invalid recipient, key reused with another payload)
    AMBIGUOUS = "ambiguous"  # lost after the data was handed over: the receiver may have it


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
    """What a webhook or object-storage transport delivers for one outbox message (as a Letter
    is for email)."""

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


class EmailTransport:
    """What both email transports share: a claim becomes a Letter from the configured sender,
    and no email receiver offers a status lookup (an uncertain message follows the policy)."""

    channel = "email"

    @property
    def sender(self) -> str:
        """The From address (RUNLEDGER_MAIL_FROM)."""
        raise NotImplementedError

    def render(self, claim: MessageClaim) -> Letter:
        return Letter.from_claim(claim, self.sender)

    async def settle(self, item: Letter) -> SendOutcome | None:
        return None
