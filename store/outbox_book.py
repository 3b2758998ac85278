"""The ledger's outbox (``Ledger.outbox``): each method is one unit of work around one transition
or read of ``store.outbox``, ``store.approvals`` or ``store.outbox_reads``, a transition followed
by its fault point."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from store import faults
from store.approvals import (
    HeldMessage,
    decide_messages_txn,
    list_held_messages,
    reject_overdue_holds_txn,
)
from store.ids import resolve_message_id
from store.models import DeliveryAttempt, QueuedMessage
from store.outbox import (
    NO_REPLY,
    MessageClaim,
    Reply,
    claim_messages_txn,
    mark_dead_txn,
    mark_sent_txn,
    mark_uncertain_txn,
    release_message_txn,
    requeue_message_txn,
    schedule_retry_txn,
)
from store.outbox_reads import (
    count_messages,
    get_message,
    list_delivery_attempts,
    list_messages,
    list_recent_messages,
)
from store.units_of_work import UnitsOfWork
from store.validators import lease_seconds


class OutboxBook:
    """The outbox messages the ledger's completions queued, their leases, delivery attempts and
    operator actions (``Ledger.outbox``)."""

    def __init__(self, ledger: UnitsOfWork) -> None:
        self._ledger = ledger

    def claim_messages(
        self, owner: str, limit: int, lease: timedelta | float, channel: str | None = None
    ) -> list[MessageClaim]:
        """Lease up to ``limit`` due messages (see ``claim_messages_txn``)."""
        return self._ledger._write(faults.AFTER_CLAIM_MESSAGES_COMMIT, claim_messages_txn,
                                   owner, limit, lease_seconds(lease), channel)

    def mark_sent(
        self, sent: Sequence[tuple[MessageClaim, Reply]]
    ) -> list[MessageClaim]:
        """Mark the messages sent in one statement or transaction (a message the same claim
        marked already counts as marked); returns the claims whose lease was lost (their rows
        are unchanged)."""
        return self._ledger._write(faults.AFTER_MARK_SENT_COMMIT, mark_sent_txn, sent)

    def schedule_retry(
        self, claim: MessageClaim, delay: float, error: str, reply: Reply = NO_REPLY
    ) -> None:
        """sending -> retry, due again after ``delay`` seconds (database clock)."""
        self._ledger._write(faults.AFTER_SCHEDULE_RETRY_COMMIT, schedule_retry_txn,
                            claim, delay, error, reply)

    def mark_uncertain(
        self, claim: MessageClaim, error: str, retry_in: float | None,
        reply: Reply = NO_REPLY,
    ) -> None:
        """sending -> uncertain: the receiver may have it (see ``mark_uncertain_txn``)."""
        self._ledger._write(faults.AFTER_MARK_UNCERTAIN_COMMIT, mark_uncertain_txn,
                            claim, error, retry_in, reply)

    def mark_dead(self, claim: MessageClaim, error: str, reply: Reply = NO_REPLY) -> None:
        """sending -> dead: only an operator requeues it."""
        self._ledger._write(faults.AFTER_MARK_DEAD_COMMIT, mark_dead_txn, claim, error, reply)

    def release_message(self, claim: MessageClaim) -> None:
        """Give back a claimed message never handed to a transport (see ``release_message_txn``)."""
        self._ledger._write(faults.AFTER_RELEASE_MESSAGE_COMMIT, release_message_txn, claim)

    def requeue_message(self, message_id: str) -> QueuedMessage:
        """Operator action: a retry, uncertain or dead message is due now, with the same key."""
        return self._ledger._write(faults.AFTER_REQUEUE_MESSAGE_COMMIT, requeue_message_txn,
                                   message_id)

    def decide(self, message_ids: Sequence[str], decision: str, by: str,
               reason: str | None = None) -> list[QueuedMessage]:
        """A person approves or rejects held messages, all or none (see ``decide_messages_txn``)."""
        return self._ledger._write(faults.AFTER_DECIDE_MESSAGES_COMMIT, decide_messages_txn,
                                   message_ids, decision, by, reason)

    def reject_overdue_holds(self, job: str) -> list[QueuedMessage]:
        """Reject the job's held messages past their deadline (see ``reject_overdue_holds_txn``)."""
        return self._ledger._write(faults.AFTER_DECIDE_MESSAGES_COMMIT, reject_overdue_holds_txn,
                                   job)

    def message(self, message_id: str) -> QueuedMessage | None:
        """The outbox message with this id, if any."""
        return self._ledger._read(get_message, message_id)

    def resolve_message_id(self, prefix: str) -> str:
        """The id of the one outbox message whose id starts with ``prefix``."""
        return self._ledger._read(resolve_message_id, prefix)

    def messages(
        self, *, status: str | None = None, run_id: str | None = None,
        channel: str | None = None, limit: int = 100,
    ) -> list[QueuedMessage]:
        """Outbox messages, oldest first."""
        return self._ledger._read(list_messages, status=status, run_id=run_id, channel=channel,
                                  limit=limit)

    def recent_messages(
        self, *, status: str | None = None, run_id: str | None = None,
        channel: str | None = None, limit: int = 100,
    ) -> list[QueuedMessage]:
        """The newest ``limit`` outbox messages, newest first."""
        return self._ledger._read(list_recent_messages, status=status, run_id=run_id,
                                  channel=channel, limit=limit)

    def held(
        self, *, job: str | None = None, period_start: datetime | None = None,
        run_id: str | None = None, limit: int = 1000,
    ) -> list[HeldMessage]:
        """Messages waiting for a person's decision, oldest first, with their Runs' identity."""
        return self._ledger._read(list_held_messages, job=job, period_start=period_start,
                                  run_id=run_id, limit=limit)

    def delivery_attempts(self, message_id: str) -> list[DeliveryAttempt]:
        """A message's delivery attempts, first try first."""
        return self._ledger._read(list_delivery_attempts, message_id)

    def message_counts(self) -> dict[str, int]:
        """Outbox messages per status."""
        return self._ledger._read(count_messages)
