"""What every transport promises: send one Letter and say, in one classified outcome, what the
receiver did with it. Configuration problems are raised as ``MailConfigurationError`` instead."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from flows.mail.letter import Letter
from store import Reply


class OutcomeKind(StrEnum):
    """How a send ended, as far as the sender can know."""

    SENT = "sent"  # the receiver accepted it
    TRANSIENT = "transient"  # not accepted, may work later (4xx, connect error, rate limit)
    PERMANENT = "permanent"  # refused for good (5xx, invalid recipient, key reused with another payload)
    AMBIGUOUS = "ambiguous"  # lost after the data was handed over: the receiver may have it


@dataclass(frozen=True)
class SendOutcome:
    """One classified send result. ``retry_after`` is the receiver's own wait hint in seconds;
    ``unreachable`` says the transport could not reach the receiver at all (end the pass)."""

    kind: OutcomeKind
    reply: Reply = field(default_factory=Reply)
    error: str | None = None
    retry_after: float | None = None
    unreachable: bool = False

    @property
    def summary(self) -> str:
        """The reply or error in one line, for the ledger's last_error and the attempt row."""
        if self.error:
            return self.error
        if self.reply.code is not None:
            return f"{self.reply.code} {self.reply.text or ''}".strip()
        return self.kind.value


class Transport(Protocol):
    """A connection to one receiver (an SMTP server or an HTTP provider), reused for a pass."""

    name: str

    @property
    def sender(self) -> str:
        """The From address (RUNLEDGER_MAIL_FROM)."""
        ...

    @property
    def key_retention_seconds(self) -> float | None:
        """How long the receiver dedupes a repeated key, or None if it promises nothing."""
        ...

    @property
    def send_reserve_seconds(self) -> float:
        """The longest one send can take before its timeouts fire."""
        ...

    async def send(self, letter: Letter) -> SendOutcome: ...

    async def aclose(self) -> None: ...
