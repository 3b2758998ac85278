"""runledger's ledger: stable Run identity, fenced leases, atomic completion with an outbox.

These names are the ledger's public surface, what ``flows`` and a job's own code use; the
modules behind them are private (an import-linter contract in ``make lint`` keeps it so)."""

from store.database import create_database_if_missing
from store.errors import (
    AmbiguousId,
    DeliveryLeaseLost,
    InvalidInput,
    InvalidTransition,
    LeaseLost,
    LedgerBusy,
    MessageNotFound,
    RunConflict,
    RunledgerError,
    RunNotFound,
)
from store.faults import fault_point
from store.identity import RunIdentity, params_fingerprint
from store.ledger import Ledger
from store.message import OutboxMessage, normalize_address
from store.models import MESSAGE_STATUSES, RUN_STATUSES, QueuedMessage, Run
from store.outbox import MessageClaim, Reply
from store.period import Period, validate_cadence, zone
from store.runs import Claim, Completion, FinishedRun, Registration
from store.settings import LedgerSettings

__all__ = [
    "MESSAGE_STATUSES", "RUN_STATUSES", "AmbiguousId", "Claim", "Completion", "DeliveryLeaseLost",
    "FinishedRun", "InvalidInput", "InvalidTransition", "LeaseLost", "Ledger", "LedgerBusy",
    "LedgerSettings", "MessageClaim", "MessageNotFound", "OutboxMessage", "Period",
    "QueuedMessage", "Registration", "Reply", "Run", "RunConflict", "RunIdentity",
    "RunNotFound", "RunledgerError", "create_database_if_missing", "fault_point",
    "normalize_address", "params_fingerprint", "validate_cadence", "zone",
]
