"""runledger's ledger: stable Run identity, fenced leases, atomic completion with an outbox."""

from store.errors import (
    AmbiguousId,
    DeliveryLeaseLost,
    InvalidIdentity,
    InvalidInput,
    InvalidMessage,
    InvalidPeriod,
    InvalidTransition,
    LeaseLost,
    LedgerBusy,
    MessageNotFound,
    OutputTooLarge,
    RunConflict,
    RunledgerError,
    RunNotFound,
)
from store.identity import RunIdentity, message_key, params_fingerprint, run_key
from store.ledger import Ledger
from store.message import OutboxMessage
from store.models import Attempt, DeliveryAttempt, QueuedMessage, Run
from store.outbox import MessageClaim, Reply
from store.period import Period
from store.runs import Claim, Completion, FinishedRun, Registration

__all__ = [
    "AmbiguousId", "Attempt", "Claim", "Completion", "DeliveryAttempt", "DeliveryLeaseLost", "FinishedRun",
    "InvalidIdentity", "InvalidInput", "InvalidMessage", "InvalidPeriod", "InvalidTransition",
    "LeaseLost", "Ledger", "LedgerBusy", "MessageClaim", "MessageNotFound", "OutboxMessage",
    "OutputTooLarge", "Period", "QueuedMessage", "Registration", "Reply", "Run", "RunConflict",
    "RunIdentity", "RunNotFound", "RunledgerError", "message_key", "params_fingerprint", "run_key",
]
