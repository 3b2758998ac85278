"""runledger's ledger: stable Run identity, fenced leases, atomic completion with an outbox.

These names are the ledger's public surface, what ``flows`` and a job's own code use; the
modules behind them are private (an import-linter contract in ``make lint`` keeps it so).

A ledger call that fails for a reason that passes raises ``LedgerBusy`` (locked by other
writers) or ``LedgerUnavailable`` (a dropped connection, a restarting server): both have
``retryable`` set and wrote nothing, so the caller may try again later; ``LedgerError`` is a
refusal that retrying will not fix. Every one is a ``RunledgerError``."""

from store.announced_limits import Announcement
from store.approvals import HeldMessage
from store.batch_book import BatchBook
from store.batch_tables import BATCH_KINDS, BATCH_STATUSES, Batch
from store.batches import (
    BatchClaim,
    BatchCounts,
    BatchLine,
    FinishedBatch,
    OpenedBatch,
    OrphanedQueue,
    ReleasedRun,
    RunRef,
    TickRef,
)
from store.budgets import BudgetExhausted, Charge, Window
from store.call_book import CallBook
from store.call_plan import WITHDRAWN, End, InFlight, Intent, Queued, Usage
from store.call_tables import ModelCall
from store.channels import (
    CHANNELS,
    EMAIL,
    OBJECT,
    WEBHOOK,
    canonical_json,
    check_block_name,
    normalize_address,
    revised_target,
    split_object_target,
)
from store.completion import CompletedBy, Completion, Effect
from store.database import create_database_if_missing
from store.dialect import Storage
from store.endpoint_limits import Limits, Slot, SlotUnavailable
from store.errors import (
    CreateInDoubt,
    DeliveryLeaseLost,
    InvalidInput,
    LeaseLost,
    LedgerBusy,
    LedgerError,
    LedgerNotReady,
    LedgerUnavailable,
    OutputPruned,
    RevisionInProgress,
    RevisionRefused,
    RunConflict,
    RunledgerError,
)
from store.faults import (
    AFTER_BATCH_CREATE,
    AFTER_BATCH_FILE_COMMIT,
    AFTER_BATCH_INTENT_COMMIT,
    AFTER_BATCH_POLLED_COMMIT,
    AFTER_BATCH_SUBMITTED_COMMIT,
    AFTER_BATCH_UPLOAD,
    AFTER_CLAIM_BATCH_COMMIT,
    AFTER_FINISH_BATCH_COMMIT,
    AFTER_MODEL_ANSWER,
    AFTER_SEND_BEFORE_MARK,
    AFTER_SETTLE_RESULTS_COMMIT,
    AFTER_STOP_WAITING_COMMIT,
    AFTER_WAIT_FOR_BATCH_COMMIT,
    MID_RESULTS_DOWNLOAD,
    fault_point,
)
from store.identity import RunIdentity, document_digest, params_fingerprint
from store.lease import Claim, Registration
from store.ledger import Ledger
from store.message import OutboxMessage
from store.model_calls import AlreadyAnswered, AlreadyQueued
from store.models import MESSAGE_STATUSES, RUN_STATUSES, Attempt, Occurrence, QueuedMessage, Run
from store.occurrence_book import OccurrenceBook
from store.occurrences import RunState, unemitted
from store.outbox import MessageClaim, Reply
from store.outbox_book import OutboxBook
from store.period import Period
from store.retention_book import RetentionBook
from store.revisions import latest_completed
from store.run_reads import OVER_BUDGET_ERROR, UNFINISHED_KINDS, FinishedRun, UnfinishedRun
from store.settings import LedgerSettings
from store.stats import Activity
from store.tombstones import MAX_BATCH, Prunable, Pruned

__all__ = [
    "AFTER_BATCH_CREATE",
    "AFTER_BATCH_FILE_COMMIT",
    "AFTER_BATCH_INTENT_COMMIT",
    "AFTER_BATCH_POLLED_COMMIT",
    "AFTER_BATCH_SUBMITTED_COMMIT",
    "AFTER_BATCH_UPLOAD",
    "AFTER_CLAIM_BATCH_COMMIT",
    "AFTER_FINISH_BATCH_COMMIT",
    "AFTER_MODEL_ANSWER",
    "AFTER_SEND_BEFORE_MARK",
    "AFTER_SETTLE_RESULTS_COMMIT",
    "AFTER_STOP_WAITING_COMMIT",
    "AFTER_WAIT_FOR_BATCH_COMMIT",
    "BATCH_KINDS",
    "BATCH_STATUSES",
    "CHANNELS",
    "EMAIL",
    "MAX_BATCH",
    "MESSAGE_STATUSES",
    "MID_RESULTS_DOWNLOAD",
    "OBJECT",
    "OVER_BUDGET_ERROR",
    "RUN_STATUSES",
    "UNFINISHED_KINDS",
    "WEBHOOK",
    "WITHDRAWN",
    "Activity",
    "AlreadyAnswered",
    "AlreadyQueued",
    "Announcement",
    "Attempt",
    "Batch",
    "BatchBook",
    "BatchClaim",
    "BatchCounts",
    "BatchLine",
    "BudgetExhausted",
    "CallBook",
    "Charge",
    "Claim",
    "CompletedBy",
    "Completion",
    "CreateInDoubt",
    "DeliveryLeaseLost",
    "Effect",
    "End",
    "FinishedBatch",
    "FinishedRun",
    "HeldMessage",
    "InFlight",
    "Intent",
    "InvalidInput",
    "LeaseLost",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "LedgerNotReady",
    "LedgerSettings",
    "LedgerUnavailable",
    "Limits",
    "MessageClaim",
    "ModelCall",
    "Occurrence",
    "OccurrenceBook",
    "OpenedBatch",
    "OrphanedQueue",
    "OutboxBook",
    "OutboxMessage",
    "OutputPruned",
    "Period",
    "Prunable",
    "Pruned",
    "Queued",
    "QueuedMessage",
    "Registration",
    "ReleasedRun",
    "Reply",
    "RetentionBook",
    "RevisionInProgress",
    "RevisionRefused",
    "Run",
    "RunConflict",
    "RunIdentity",
    "RunRef",
    "RunState",
    "RunledgerError",
    "Slot",
    "SlotUnavailable",
    "Storage",
    "TickRef",
    "UnfinishedRun",
    "Usage",
    "Window",
    "canonical_json",
    "check_block_name",
    "create_database_if_missing",
    "document_digest",
    "fault_point",
    "latest_completed",
    "normalize_address",
    "params_fingerprint",
    "revised_target",
    "split_object_target",
    "unemitted",
]
