"""Reads of the outbox: a message by id, messages oldest or newest first, a message's delivery
attempts, counts per status. Each is one named statement."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.models import DeliveryAttempt, QueuedMessage, delivery_attempts_table, outbox_table
from store.statement import Statement, optional, param

outbox = outbox_table
deliveries = delivery_attempts_table

_GET = Statement(
    "get_message", "An outbox message by id.",
    lambda d: sa.select(outbox).where(outbox.c.message_id == param(outbox.c.message_id)))
_LIST = Statement(
    "list_messages", "Outbox messages, oldest first, optionally of one status, one Run and one "
    "channel.",
    lambda d: sa.select(outbox).where(optional(outbox.c.status), optional(outbox.c.run_id),
                                      optional(outbox.c.channel))
    .order_by(outbox.c.created_at, outbox.c.message_id)
    .limit(sa.bindparam("limit", type_=sa.Integer())))
_LIST_RECENT = Statement(
    "list_recent_messages",
    "The newest outbox messages first, optionally of one status, one Run and one channel.",
    lambda d: sa.select(outbox).where(optional(outbox.c.status), optional(outbox.c.run_id),
                                      optional(outbox.c.channel))
    .order_by(outbox.c.created_at.desc(), outbox.c.message_id.desc())
    .limit(sa.bindparam("limit", type_=sa.Integer())))
_LIST_DELIVERIES = Statement(
    "list_delivery_attempts", "A message's delivery attempts in order.",
    lambda d: sa.select(deliveries).where(deliveries.c.message_id == param(outbox.c.message_id))
    .order_by(deliveries.c.attempt))
_COUNT = Statement(
    "count_messages", "Outbox messages per status.",
    lambda d: sa.select(outbox.c.status, sa.func.count().label("messages"))
    .group_by(outbox.c.status))


def message_from_row(row: dict[str, Any]) -> QueuedMessage:
    """The message of a row the ledger read or returned."""
    return QueuedMessage.model_validate(row)


def get_message(conn: Connection, message_id: str) -> QueuedMessage | None:
    """The outbox message with this id, if any."""
    row = _GET.first(conn, message_id=message_id)
    return message_from_row(row) if row else None


def list_messages(
    conn: Connection, *, status: str | None = None, run_id: str | None = None,
    channel: str | None = None, limit: int = 100,
) -> list[QueuedMessage]:
    """Outbox messages, oldest first."""
    return [message_from_row(r) for r in _LIST.rows(conn, status=status, run_id=run_id, channel=channel,
                                            limit=limit)]


def list_recent_messages(
    conn: Connection, *, status: str | None = None, run_id: str | None = None,
    channel: str | None = None, limit: int = 100,
) -> list[QueuedMessage]:
    """The newest ``limit`` outbox messages, newest first (what a person looks at)."""
    return [message_from_row(r) for r in _LIST_RECENT.rows(conn, status=status, run_id=run_id,
                                                   channel=channel, limit=limit)]


def list_delivery_attempts(conn: Connection, message_id: str) -> list[DeliveryAttempt]:
    """A message's delivery attempts, first try first."""
    return [DeliveryAttempt.model_validate(r)
            for r in _LIST_DELIVERIES.rows(conn, message_id=message_id)]


def count_messages(conn: Connection) -> dict[str, int]:
    """Messages per status (for summaries and the CLI)."""
    return {r["status"]: r["messages"] for r in _COUNT.rows(conn)}
