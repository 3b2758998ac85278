"""runledger's ledger: stable Run identity, fenced leases, atomic completion with an outbox.

These names are the ledger's public surface, what ``flows`` and a job's own code use; the
modules behind them are private (an import-linter contract in ``make lint`` keeps it so)."""

from store.database import create_database_if_missing
from store.dialect import Storage
from store.errors import (
    DeliveryLeaseLost,
    InvalidInput,
    LeaseLost,
    OutputPruned,
    RevisionInProgress,
    RevisionRefused,
    RunConflict,
    RunledgerError,
)
from store.faults import AFTER_MODEL_ANSWER, AFTER_SEND_BEFORE_MARK, fault_point
from store.identity import RunIdentity, document_digest, params_fingerprint
from store.ledger import Ledger
from store.message import OutboxMessage, normalize_address
from store.models import (
    MESSAGE_STATUSES,
    RUN_STATUSES,
    Attempt,
    Occurrence,
    QueuedMessage,
    Run,
)
from store.occurrences import RunState, unemitted
from store.outbox import MessageClaim, Reply
from store.period import Period
from store.runs import (
    Claim,
    CompletedBy,
    Completion,
    Effect,
    FinishedRun,
    Registration,
    Revision,
    latest_completed,
)
from store.settings import LedgerSettings
from store.stats import Activity
from store.tombstones import MAX_BATCH, Prunable, Pruned

__all__ = [
    "AFTER_MODEL_ANSWER", "AFTER_SEND_BEFORE_MARK", "MAX_BATCH", "MESSAGE_STATUSES",
    "RUN_STATUSES",
    "Activity", "Attempt", "Claim", "CompletedBy", "Completion",
    "DeliveryLeaseLost", "Effect", "FinishedRun", "InvalidInput", "LeaseLost", "Ledger",
    "LedgerSettings", "MessageClaim", "Occurrence", "OutboxMessage", "OutputPruned", "Period",
    "Prunable", "Pruned", "QueuedMessage", "Registration", "Reply", "Revision",
    "RevisionInProgress", "RevisionRefused", "Run", "RunConflict", "RunIdentity", "RunState",
    "RunledgerError", "Storage", "create_database_if_missing", "document_digest",
    "fault_point", "latest_completed",
    "normalize_address", "params_fingerprint", "unemitted",
]
