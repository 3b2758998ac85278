"""The retry policy: what each classified send outcome does to an outbox message. Transient
failures back off exponentially with full jitter inside an attempt limit and a total window;
permanent ones are dead; ambiguous ones are uncertain and retried (same key) or held."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from flows.errors import DeliveryConfigurationError
from flows.transport import OutcomeKind, SendOutcome
from store import InvalidInput, MessageClaim


class UncertainPolicy(StrEnum):
    """What to do with a message the receiver may already have."""

    RETRY = "retry"  # send again with the same Message-ID / key, inside the retry window
    HOLD = "hold"  # leave it uncertain for an operator (`runledger outbox requeue ID`)


class Status(StrEnum):
    """Where a message goes after one attempt (the outbox's terminal or waiting states)."""

    SENT = "sent"
    RETRY = "retry"
    UNCERTAIN = "uncertain"
    DEAD = "dead"


@dataclass(frozen=True)
class Decision:
    """The next state of a message; ``delay`` is seconds until it is due again (None: not due)."""

    status: Status
    delay: float | None = None
    error: str | None = None


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


@dataclass(frozen=True)
class RetryPolicy:
    """Attempt ``n`` that failed transiently waits uniform(0, min(max_delay, base_delay * 2**(n-1)))
    seconds (full jitter), at least the receiver's Retry-After; a message is dead after
    ``max_attempts`` attempts or when its next try would fall more than ``max_window`` seconds
    after it was queued (measured on the database clock)."""

    max_attempts: int = 8
    base_delay: float = 30.0
    max_delay: float = 3600.0
    max_window: float = 12 * 3600.0
    uncertain: UncertainPolicy = UncertainPolicy.RETRY

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidInput(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not 0 < self.base_delay <= self.max_delay:
            raise InvalidInput(
                f"delays must satisfy 0 < base_delay <= max_delay, got {self.base_delay} and "
                f"{self.max_delay}"
            )
        if self.max_window <= 0:
            raise InvalidInput(f"max_window must be positive, got {self.max_window}")

    def ceiling(self, attempt: int) -> float:
        """The largest backoff after failed attempt ``attempt`` (1-based)."""
        return float(min(self.max_delay, self.base_delay * 2 ** min(attempt - 1, 64)))

    def backoff(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, self.ceiling(attempt))

    def check_retention(self, retention_seconds: float | None, transport: str) -> None:
        """Refuse a window longer than the receiver remembers keys: a retry after the key expired
        could deliver a second copy."""
        if retention_seconds is not None and self.max_window > retention_seconds:
            raise DeliveryConfigurationError(
                f"the retry window ({_duration(self.max_window)}, RUNLEDGER_DELIVERY_MAX_WINDOW_HOURS) "
                f"is longer than {transport}'s idempotency-key retention "
                f"({_duration(retention_seconds)}); shorten the window"
            )

    def decide(self, claim: MessageClaim, outcome: SendOutcome, rng: random.Random) -> Decision:
        if outcome.kind is OutcomeKind.SENT:
            return Decision(Status.SENT)
        if outcome.kind is OutcomeKind.PERMANENT:
            return Decision(Status.DEAD, error=outcome.summary)
        delay = max(self.backoff(claim.attempt, rng), outcome.retry_after or 0.0)
        waited = (claim.claimed_at - claim.created_at).total_seconds()
        limit = None
        if claim.attempt >= self.max_attempts:
            limit = f"gave up after {claim.attempt} attempts"
        elif waited + delay > self.max_window:
            limit = f"retry window of {_duration(self.max_window)} exhausted"
        if outcome.kind is OutcomeKind.TRANSIENT:
            if limit:
                return Decision(Status.DEAD, error=f"{limit}; last error: {outcome.summary}")
            return Decision(Status.RETRY, delay, outcome.summary)
        if self.uncertain is UncertainPolicy.HOLD:
            return Decision(Status.UNCERTAIN, None, f"{outcome.summary}; held for an operator")
        if limit:
            return Decision(Status.UNCERTAIN, None,
                            f"{outcome.summary}; {limit}, held for an operator")
        return Decision(Status.UNCERTAIN, delay, outcome.summary)
