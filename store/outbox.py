"""Outbox transitions used by the dispatcher. A message is claimed with a delivery lease and a
fence; only the current holder can record the outcome of its delivery attempt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from store.dialect import db_now, is_postgres, json_rows, seconds
from store.errors import DeliveryLeaseLost, InvalidInput, InvalidTransition, MessageNotFound
from store.models import (
    CLAIMABLE_WHERE,
    DeliveryAttempt,
    QueuedMessage,
    delivery_attempts_table,
    outbox_table,
)
from store.prepared import Prepared

outbox = outbox_table
deliveries = delivery_attempts_table

DUE_STATUSES = ("pending", "retry", "uncertain")
REQUEUEABLE = ("retry", "uncertain", "dead")


@dataclass(frozen=True)
class MessageClaim:
    """Proof of holding one message's delivery lease, with what is needed to send it."""

    message_id: str
    owner: str
    fence: int
    attempt: int
    run_id: str
    channel: str
    recipient: str
    subject: str
    body: str
    headers: dict[str, str]
    created_at: datetime
    claimed_at: datetime
    previous_status: str = "pending"


@dataclass(frozen=True)
class Reply:
    """What the receiver or provider answered (all optional)."""

    code: int | None = None
    text: str | None = None
    provider_message_id: str | None = None


NO_REPLY = Reply()


def claim_messages_txn(
    conn: Connection, owner: str, limit: int, lease_seconds: float, channel: str | None = None
) -> list[MessageClaim]:
    """Lease up to ``limit`` due messages (or ones whose delivery lease expired), skipping rows
    another dispatcher has locked; each claim bumps the message's fence and attempt count."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput(f"limit must be a positive integer, got {limit!r}")
    if not owner or not owner.strip():
        raise InvalidInput("owner must be a non-empty string such as host:pid")
    now = db_now()
    due = (
        sa.select(outbox.c.message_id, outbox.c.status)
        .where(
            # Implies the predicate of ix_outbox_claimable and bounds its first column, so the
            # planner reads that index in claim order and stops after ``limit`` rows. A message
            # in "sending" was due when it was claimed, so its next_attempt_at is past too.
            sa.text(CLAIMABLE_WHERE),
            outbox.c.next_attempt_at <= now,
            sa.or_(outbox.c.status != "sending", outbox.c.lease_expires_at <= now),
        )
        .order_by(outbox.c.next_attempt_at, outbox.c.message_id)
        .limit(limit)
    )
    if channel is not None:
        due = due.where(outbox.c.channel == channel)
    claim = sa.update(outbox).values(
        status="sending", lease_owner=owner, fence=outbox.c.fence + 1,
        attempts=outbox.c.attempts + 1, claimed_at=now, updated_at=now,
        lease_expires_at=db_now(seconds(lease_seconds, "lease")),
    )
    if is_postgres(conn):
        # One statement: the locked rows' previous status comes back through the join.
        locked = due.with_for_update(skip_locked=True).cte("due")
        rows = conn.execute(
            claim.where(outbox.c.message_id == locked.c.message_id)
            .returning(*outbox.c, locked.c.status.label("previous_status"))
        ).all()
        previous = {r.message_id: r.previous_status for r in rows}
    else:
        # BEGIN IMMEDIATE already holds the write lock: nobody can change these rows in between.
        previous = {r.message_id: r.status for r in conn.execute(due)}
        rows = conn.execute(
            claim.where(outbox.c.message_id.in_(list(previous))).returning(*outbox.c)
        ).all() if previous else []
    claims = [
        MessageClaim(
            message_id=r.message_id, owner=owner, fence=r.fence, attempt=r.attempts,
            run_id=r.run_id, channel=r.channel, recipient=r.recipient, subject=r.subject,
            body=r.body, headers=dict(r.headers or {}), created_at=r.created_at,
            claimed_at=r.claimed_at, previous_status=previous[r.message_id],
        )
        for r in rows
    ]
    return sorted(claims, key=lambda c: (c.created_at, c.message_id))


def _holder(claim: MessageClaim) -> sa.ColumnElement[bool]:
    return sa.and_(
        outbox.c.message_id == claim.message_id,
        outbox.c.fence == claim.fence,
        outbox.c.lease_owner == claim.owner,
        outbox.c.status == "sending",
    )


def _lease_lost(claim: MessageClaim) -> DeliveryLeaseLost:
    return DeliveryLeaseLost(
        f"message {claim.message_id}: delivery fence {claim.fence} of {claim.owner} is no "
        "longer current; its outcome was not recorded"
    )


def _record_outcome(
    conn: Connection, claim: MessageClaim, outcome: str, reply: Reply, values: dict[str, Any]
) -> None:
    now = db_now()
    update = (
        sa.update(outbox)
        .where(_holder(claim))
        .values(status=outcome, lease_owner=None, lease_expires_at=None, updated_at=now, **values)
        .returning(outbox.c.message_id)
    )
    attempt = {
        "message_id": claim.message_id, "attempt": claim.attempt, "owner": claim.owner,
        "started_at": claim.claimed_at, "outcome": outcome, "reply_code": reply.code,
        "reply_text": reply.text, "provider_message_id": reply.provider_message_id,
    }
    if is_postgres(conn):
        # One round trip: the attempt row is written only if the guarded update matched.
        updated = update.cte("updated")
        names = list(attempt)
        record = postgresql.insert(deliveries).from_select(
            [*names, "finished_at"],
            sa.select(
                *[sa.literal(attempt[n], deliveries.c[n].type) for n in names], now
            ).where(sa.exists(sa.select(updated.c.message_id))),
        ).cte("recorded")
        matched = conn.execute(sa.select(updated).add_cte(record)).first()
    else:
        matched = conn.execute(update).first()
        if matched is not None:
            conn.execute(sa.insert(deliveries).values(**attempt, finished_at=now))
    if matched is None:
        raise _lease_lost(claim)


# A group of sent marks is one JSON array parameter, so one prepared statement fits any size.
_SENT_GIVEN = [outbox.c.message_id, outbox.c.fence, deliveries.c.owner, deliveries.c.reply_code,
               deliveries.c.reply_text, deliveries.c.provider_message_id]
_RECORDED = ["message_id", "attempt", "owner", "started_at", "outcome", "reply_code", "reply_text",
             "provider_message_id", "finished_at"]


def _sent_holder(given: Any) -> sa.ColumnElement[bool]:
    return sa.and_(
        outbox.c.message_id == given.c.message_id, outbox.c.fence == given.c.fence,
        outbox.c.lease_owner == given.c.owner,
        # Written as an expression so that SQLite looks each given row up by primary key
        # instead of looping over every 'sending' row through the status index.
        outbox.c.status.concat("") == "sending",
    )


def _mark_sent(given: Any) -> sa.Update:
    now = db_now()
    return sa.update(outbox).where(_sent_holder(given)).values(
        status="sent", lease_owner=sa.null(), lease_expires_at=sa.null(), updated_at=now,
        sent_at=now, next_attempt_at=sa.null(), last_error=sa.null(),
        provider_message_id=given.c.provider_message_id,
    )


def _mark_sent_in_one_statement(d: str) -> sa.Select[Any]:
    """PostgreSQL: mark the held rows and record their attempts from what the update returned
    (a row another dispatcher took meanwhile is neither marked nor recorded)."""
    given = json_rows(d, "sent", _SENT_GIVEN).cte("given")
    # = ANY(ARRAY(...)) makes the planner look the rows up by primary key; a join with the
    # function's rows would scan the whole (ever growing) outbox.
    by_key = outbox.c.message_id == sa.any_(sa.func.array(sa.select(given.c.message_id).scalar_subquery()))
    updated = _mark_sent(given).where(by_key).returning(
        outbox.c.message_id, outbox.c.attempts, outbox.c.claimed_at, given.c.owner,
        given.c.reply_code, given.c.reply_text, given.c.provider_message_id,
    ).cte("updated")
    recorded = sa.insert(deliveries).from_select(_RECORDED, sa.select(
        updated.c.message_id, updated.c.attempts, updated.c.owner, updated.c.claimed_at,
        sa.literal("sent"), updated.c.reply_code, updated.c.reply_text,
        updated.c.provider_message_id, db_now(),
    )).cte("recorded")
    return sa.select(updated.c.message_id).add_cte(recorded)


def _record_held_as_sent(d: str) -> sa.Insert:
    """SQLite (under the write lock): the attempt rows of the held messages, before marking."""
    given = json_rows(d, "sent", _SENT_GIVEN).subquery("given")
    return sa.insert(deliveries).from_select(_RECORDED, sa.select(
        outbox.c.message_id, outbox.c.attempts, given.c.owner, outbox.c.claimed_at,
        sa.literal("sent"), given.c.reply_code, given.c.reply_text, given.c.provider_message_id,
        db_now(),
    ).where(_sent_holder(given)))


_MARK_SENT_PG = Prepared(_mark_sent_in_one_statement)
_RECORD_SENT = Prepared(_record_held_as_sent)
_MARK_SENT = Prepared(
    lambda d: _mark_sent(json_rows(d, "sent", _SENT_GIVEN).subquery("given"))
    .returning(outbox.c.message_id)
)


def mark_sent_many_txn(
    conn: Connection, sent: Sequence[tuple[MessageClaim, Reply]]
) -> list[MessageClaim]:
    """sending -> sent for several messages in one statement (PostgreSQL) or one locked
    transaction (SQLite); each row only by its current lease holder. Returns the claims whose
    lease had moved on: those rows are unchanged and no attempt is recorded for them."""
    if not sent:
        return []
    given = [{"message_id": c.message_id, "fence": c.fence, "owner": c.owner,
              "reply_code": r.code, "reply_text": r.text, "provider_message_id": r.provider_message_id}
             for c, r in sent]
    if is_postgres(conn):
        marked = _MARK_SENT_PG.rows(conn, sent=given)
    else:
        _RECORD_SENT.rows(conn, sent=given)
        marked = _MARK_SENT.rows(conn, sent=given)
    matched = {row["message_id"] for row in marked}
    return [claim for claim, _ in sent if claim.message_id not in matched]


def mark_sent_txn(conn: Connection, claim: MessageClaim, reply: Reply = NO_REPLY) -> None:
    """sending -> sent; only the current delivery-lease holder can."""
    if mark_sent_many_txn(conn, [(claim, reply)]):
        raise _lease_lost(claim)


def schedule_retry_txn(
    conn: Connection, claim: MessageClaim, delay_seconds: float, error: str, reply: Reply = NO_REPLY
) -> None:
    """sending -> retry, due again after ``delay_seconds`` by the database clock."""
    _record_outcome(conn, claim, "retry", reply, {
        "next_attempt_at": db_now(seconds(delay_seconds, "delay")), "last_error": error,
    })


def mark_uncertain_txn(
    conn: Connection,
    claim: MessageClaim,
    error: str,
    retry_in_seconds: float | None,
    reply: Reply = NO_REPLY,
) -> None:
    """sending -> uncertain: the receiver may have it; due again (same key) only if a delay is given."""
    next_at = None if retry_in_seconds is None else db_now(seconds(retry_in_seconds, "delay"))
    _record_outcome(conn, claim, "uncertain", reply, {"next_attempt_at": next_at, "last_error": error})


def mark_dead_txn(conn: Connection, claim: MessageClaim, error: str, reply: Reply = NO_REPLY) -> None:
    """sending -> dead: permanent rejection or limits exhausted; only an operator requeues it."""
    _record_outcome(conn, claim, "dead", reply, {"next_attempt_at": None, "last_error": error})


def release_message_txn(conn: Connection, claim: MessageClaim) -> None:
    """Give back a claimed message that was never handed to a transport: it returns to the
    status it was claimed from, due now, and the try is not counted."""
    restored = claim.previous_status
    if restored not in DUE_STATUSES:
        # Taken over from an expired lease: its earlier holder's try already counts.
        restored = "pending" if claim.attempt <= 1 else "retry"
    conn.execute(
        sa.update(outbox)
        .where(_holder(claim))
        .values(
            status=restored, attempts=outbox.c.attempts - 1, lease_owner=None,
            lease_expires_at=None, next_attempt_at=db_now(), updated_at=db_now(),
        )
    )


def requeue_message_txn(conn: Connection, message_id: str) -> QueuedMessage:
    """Operator action: a retry, uncertain or dead message is due now, with the same key."""
    row = conn.execute(
        sa.update(outbox)
        .where(outbox.c.message_id == message_id, outbox.c.status.in_(REQUEUEABLE))
        .values(status="pending", next_attempt_at=db_now(), updated_at=db_now())
        .returning(*outbox.c)
    ).first()
    if row is None:
        current = get_message(conn, message_id)
        if current is None:
            raise MessageNotFound(f"no outbox message with id {message_id!r}")
        raise InvalidTransition(
            f"message {message_id} is {current.status}; only {', '.join(REQUEUEABLE)} can be requeued"
        )
    return QueuedMessage.model_validate(dict(row._mapping))


def get_message(conn: Connection, message_id: str) -> QueuedMessage | None:
    row = conn.execute(sa.select(outbox).where(outbox.c.message_id == message_id)).first()
    return QueuedMessage.model_validate(dict(row._mapping)) if row else None


def list_messages(
    conn: Connection, *, status: str | None = None, run_id: str | None = None, limit: int = 100
) -> list[QueuedMessage]:
    query = sa.select(outbox).order_by(outbox.c.created_at, outbox.c.message_id).limit(limit)
    if status is not None:
        query = query.where(outbox.c.status == status)
    if run_id is not None:
        query = query.where(outbox.c.run_id == run_id)
    return [QueuedMessage.model_validate(dict(r._mapping)) for r in conn.execute(query)]


def list_delivery_attempts(conn: Connection, message_id: str) -> list[DeliveryAttempt]:
    query = (
        sa.select(deliveries).where(deliveries.c.message_id == message_id)
        .order_by(deliveries.c.attempt)
    )
    return [DeliveryAttempt.model_validate(dict(r._mapping)) for r in conn.execute(query)]


def count_messages(conn: Connection) -> dict[str, int]:
    """Messages per status (for summaries and the CLI)."""
    query = sa.select(outbox.c.status, sa.func.count()).group_by(outbox.c.status)
    return {status: n for status, n in conn.execute(query).all()}
