"""The outbox queue: a completion's outbox rows, one per (run, channel, recipient), queued with
the Run it completes (``store.runs.complete_txn``: in the same statement on PostgreSQL, as a
statement of its own on SQLite); a held row waits for a person's decision until its deadline."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import db_now, insert_ignoring_conflicts, json_rows
from store.errors import InvalidInput
from store.identity import message_key
from store.message import OutboxMessage
from store.models import outbox_table
from store.statement import Statement, insert_rows
from store.validators import check_seconds

outbox = outbox_table


def message_rows(run_id: str, messages: Iterable[OutboxMessage]) -> list[dict[str, Any]]:
    """A completion's outbox rows, one per (run, channel, recipient): the first message to a
    recipient on a channel is kept."""
    rows: dict[str, dict[str, Any]] = {}
    for message in messages:
        if not isinstance(message, OutboxMessage):
            raise InvalidInput(f"messages must be OutboxMessage objects, got {type(message).__name__}")
        key = message_key(run_id, message.channel, message.recipient)
        hold = None if message.hold is None else message.hold.total_seconds()
        rows.setdefault(key, {
            "message_id": key, "run_id": run_id, "channel": message.channel,
            "recipient": message.recipient, "subject": message.subject, "body": message.body,
            "headers": dict(message.headers), "payload": message.payload,
            "status": "pending" if hold is None else "held",
            "hold_seconds": None if hold is None else check_seconds(hold, "hold"),
        })
    return list(rows.values())


_GIVEN = ("message_id", "run_id", "channel", "recipient", "subject", "body", "headers",
          "payload", "status")
_HOLD_SECONDS = sa.Column("hold_seconds", sa.Float())


def queue(d: str, only_if: sa.ColumnElement[bool] | None = None) -> sa.Insert:
    """The Run's outbox rows, from one JSON array parameter; a row already queued is a no-op.
    A held row is overdue ``hold_seconds`` after now (database clock)."""
    given = json_rows(d, "messages", [*[outbox.c[n] for n in _GIVEN], _HOLD_SECONDS]
                      ).subquery("given")
    now = db_now()
    hold = given.c.hold_seconds
    # Always a WHERE: SQLite cannot otherwise tell ON CONFLICT from a join's ON.
    rows = sa.select(
        *[given.c[n] for n in _GIVEN], sa.literal(0), sa.literal(0), now, now, now,
        sa.case((hold.is_(None), sa.null()), else_=db_now(hold)),
    ).where(sa.true() if only_if is None else only_if)
    return insert_rows(insert_ignoring_conflicts(d, outbox),
        [*_GIVEN, "attempts", "fence", "next_attempt_at", "created_at", "updated_at",
         "hold_until"],
        rows,
    )


_QUEUE = Statement(
    "queue_messages", "The completed Run's outbox rows, one per (run, channel, recipient); a "
    "row already queued is left as it is.", queue, dialects=("sqlite",))


def queue_messages(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Queue a completed Run's outbox rows (``message_rows``) as a statement of its own, where
    the completion's statement cannot carry them (SQLite)."""
    _QUEUE.rows(conn, messages=rows)
