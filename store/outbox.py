"""The outbox's deliveries: the dispatcher claims due messages with a delivery lease and a
fence; only the current holder can record the outcome of a delivery attempt; an operator can
requeue one. A completion queues the messages (``store.outbox_queue``), a person decides held
ones (``store.approvals``), reads are ``store.outbox_reads``. Each ``*_txn`` is one transition
(the caller owns the transaction) over named statements (``store.statement``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import (
    db_now,
    json_rows,
    one_statement_writes,
    skip_locked,
)
from store.errors import DeliveryLeaseLost, InvalidInput, InvalidTransition, MessageNotFound
from store.fence import DELIVERY_LEASE
from store.models import CLAIMABLE_WHERE, QueuedMessage, delivery_attempts_table, outbox_table
from store.outbox_reads import get_message, message_from_row
from store.statement import ON_POSTGRES, Statement, insert_rows, one_of, optional, param, transition
from store.validators import check_seconds

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
    payload: dict[str, Any] | None = None  # a webhook's JSON, an object's body; None for email


@dataclass(frozen=True)
class Reply:
    """What the receiver or provider answered (all optional)."""

    code: int | None = None
    text: str | None = None
    provider_message_id: str | None = None


NO_REPLY = Reply()


# --- statements: one name and one rule each (store/sql/<dialect>.sql shows what they send) ---


def _due(d: str) -> sa.Select[Any]:
    now = db_now()
    return skip_locked(
        sa.select(outbox.c.message_id, outbox.c.status)
        .where(
            # Implies the predicate of ix_outbox_claimable and bounds its first column, so the
            # planner reads that index in claim order and stops after ``limit`` rows. A message
            # in "sending" was due when it was claimed, so its next_attempt_at is past too.
            sa.text(CLAIMABLE_WHERE),
            outbox.c.next_attempt_at <= now,
            sa.or_(outbox.c.status != "sending", outbox.c.lease_expires_at <= now),
            optional(outbox.c.channel),
        )
        .order_by(outbox.c.next_attempt_at, outbox.c.message_id)
        .limit(sa.bindparam("limit", type_=sa.Integer())), d)


def _take(d: str) -> Any:
    now = db_now()
    claim = sa.update(outbox).values(
        status="sending", lease_owner=param(outbox.c.lease_owner, "owner"), fence=outbox.c.fence + 1,
        attempts=outbox.c.attempts + 1, claimed_at=now, updated_at=now,
        lease_expires_at=db_now(sa.bindparam("lease", type_=sa.Float())),
    )
    if d != "postgresql":  # the due rows were read first, under the write lock
        return claim.where(outbox.c.message_id.in_(
            json_rows(d, "due", [outbox.c.message_id]))).returning(*outbox.c)
    # One statement: the locked rows' previous status comes back through the join.
    locked = _due(d).cte("due")
    return claim.where(outbox.c.message_id == locked.c.message_id).returning(
        *outbox.c, locked.c.status.label("previous_status"))


_DUE = Statement(
    "due_messages", "The due messages (or ones whose delivery lease expired) in claim order, "
    "optionally of one channel.", _due, dialects=("sqlite",))
_CLAIM = Statement(
    "claim_messages", "Lease the due messages, skipping rows another dispatcher has locked "
    "(PostgreSQL: due and taken in one statement); each claim bumps the fence and counts the "
    "attempt.", _take)


_ATTEMPT = ("message_id", "attempt", "owner", "started_at", "outcome", "reply_code",
            "reply_text", "provider_message_id")


def _record(d: str) -> Any:
    delay = sa.bindparam("delay", type_=sa.Float())
    update = (
        sa.update(outbox).where(DELIVERY_LEASE.holder())
        .values(status=param(deliveries.c.outcome), lease_owner=sa.null(), lease_expires_at=sa.null(),
                updated_at=db_now(), last_error=param(outbox.c.last_error),
                next_attempt_at=sa.case((sa.cast(delay, sa.Float()).is_(None), sa.null()),
                                        else_=db_now(delay)))
        .returning(outbox.c.message_id)
    )
    if d != "postgresql":
        return update  # the attempt row follows as a statement of its own
    # One round trip: the attempt row is written only if the guarded update matched.
    updated = update.cte("updated")
    recorded = insert_rows(sa.insert(deliveries),
        [*_ATTEMPT, "finished_at"],
        sa.select(*[param(deliveries.c[n]) for n in _ATTEMPT], db_now())
        .where(sa.exists(sa.select(updated.c.message_id))),
    ).cte("recorded")
    return sa.select(updated).add_cte(recorded)


_RECORD = Statement(
    "record_delivery_outcome", "sending -> retry, uncertain or dead, with the error and when "
    "it is due again (database clock, or never); only the current delivery-lease holder can "
    "(PostgreSQL: with its delivery attempt row in the same statement).", _record)
_RECORD_ATTEMPT = Statement(
    "record_delivery_attempt", "One delivery attempt row per try, unique per (message, attempt).",
    lambda d: sa.insert(deliveries).values(
        **{n: param(deliveries.c[n]) for n in _ATTEMPT}, finished_at=db_now()),
    dialects=("sqlite",))


# A group of sent marks is one JSON array parameter, so one statement fits any size.
_SENT_GIVEN = [outbox.c.message_id, outbox.c.fence, deliveries.c.owner, deliveries.c.reply_code,
               deliveries.c.reply_text, deliveries.c.provider_message_id]
_RECORDED = ["message_id", "attempt", "owner", "started_at", "outcome", "reply_code", "reply_text",
             "provider_message_id", "finished_at"]


def _sent_holder(given: Any) -> sa.ColumnElement[bool]:
    # The status written as an expression so that SQLite looks each given row up by primary
    # key instead of looping over every 'sending' row through the status index.
    return DELIVERY_LEASE.holder(key=given.c.message_id, fence=given.c.fence,
                                 owner=given.c.owner, status=outbox.c.status.concat(""))


def _mark_sent_update(given: Any) -> sa.Update:
    now = db_now()
    return sa.update(outbox).where(_sent_holder(given)).values(
        status="sent", lease_owner=sa.null(), lease_expires_at=sa.null(), updated_at=now,
        sent_at=now, next_attempt_at=sa.null(), last_error=sa.null(),
        provider_message_id=given.c.provider_message_id,
    )


def _mark_sent(d: str) -> Any:
    if d != "postgresql":  # the attempt rows were recorded first, under the write lock
        return _mark_sent_update(json_rows(d, "sent", _SENT_GIVEN).subquery("given")).returning(
            outbox.c.message_id)
    # The held rows are marked and their attempts recorded from what the update returned (a row
    # another dispatcher took meanwhile is neither marked nor recorded).
    given = json_rows(d, "sent", _SENT_GIVEN).cte("given")
    # = ANY(ARRAY(...)) makes the planner look the rows up by primary key; a join with the
    # function's rows would scan the whole (ever growing) outbox.
    by_key = outbox.c.message_id == sa.any_(sa.func.array(sa.select(given.c.message_id).scalar_subquery()))
    updated = _mark_sent_update(given).where(by_key).returning(
        outbox.c.message_id, outbox.c.attempts, outbox.c.claimed_at, given.c.owner,
        given.c.reply_code, given.c.reply_text, given.c.provider_message_id,
    ).cte("updated")
    recorded = insert_rows(sa.insert(deliveries), _RECORDED, sa.select(
        updated.c.message_id, updated.c.attempts, updated.c.owner, updated.c.claimed_at,
        sa.literal("sent"), updated.c.reply_code, updated.c.reply_text,
        updated.c.provider_message_id, db_now(),
    )).cte("recorded")
    return sa.select(updated.c.message_id).add_cte(recorded)


def _record_held_as_sent(d: str) -> sa.Insert:
    given = json_rows(d, "sent", _SENT_GIVEN).subquery("given")
    return insert_rows(sa.insert(deliveries), _RECORDED, sa.select(
        outbox.c.message_id, outbox.c.attempts, given.c.owner, outbox.c.claimed_at,
        sa.literal("sent"), given.c.reply_code, given.c.reply_text, given.c.provider_message_id,
        db_now(),
    ).where(_sent_holder(given)))


_RECORD_SENT = Statement(
    "record_sent_attempts", "The delivery attempt rows of the given messages still held under "
    "their fence and owner, before they are marked sent.", _record_held_as_sent,
    dialects=("sqlite",))
_MARK_SENT = Statement(
    "mark_sent", "sending -> sent for the given messages, each only by its current "
    "delivery-lease holder (PostgreSQL: with their delivery attempt rows in the same statement).",
    _mark_sent)

def _sent_by(d: str) -> sa.Select[Any]:
    given = json_rows(d, "sent", [outbox.c.message_id, outbox.c.fence, deliveries.c.owner,
                                  deliveries.c.attempt]).subquery("given")
    mine = sa.select(deliveries.c.id).where(
        deliveries.c.message_id == given.c.message_id, deliveries.c.attempt == given.c.attempt,
        deliveries.c.owner == given.c.owner, deliveries.c.outcome == "sent")
    return sa.select(outbox.c.message_id).where(
        outbox.c.message_id == given.c.message_id, outbox.c.fence == given.c.fence,
        outbox.c.status == "sent", sa.exists(mine))


_SENT_BY = Statement(
    "read_sent_by_claim", "Which of the given messages are sent already by the given claim (its "
    "fence, and its attempt recorded sent by its owner): a mark retried after its commit "
    "succeeded.", _sent_by)

_RELEASE = Statement(
    "release_message", "A claimed message never handed to a transport returns to the status it "
    "was claimed from, due now, and its try is not counted; only its lease holder can.",
    lambda d: sa.update(outbox).where(DELIVERY_LEASE.holder()).values(
        status=param(outbox.c.status), attempts=outbox.c.attempts - 1, lease_owner=sa.null(),
        lease_expires_at=sa.null(), next_attempt_at=db_now(), updated_at=db_now()))

_REQUEUE = Statement(
    "requeue_message", "Operator action: a retry, uncertain or dead message is due now, with "
    "the same key; no other status can be requeued.",
    lambda d: sa.update(outbox)
    .where(outbox.c.message_id == param(outbox.c.message_id), one_of(outbox.c.status, REQUEUEABLE))
    .values(status="pending", next_attempt_at=db_now(), updated_at=db_now())
    .returning(*outbox.c))

def _delivery_lease_lost(claim: MessageClaim) -> DeliveryLeaseLost:
    return DeliveryLeaseLost(
        f"message {claim.message_id}: delivery fence {claim.fence} of {claim.owner} is no "
        "longer current; its outcome was not recorded"
    )


def _holder_params(claim: MessageClaim) -> dict[str, Any]:
    return DELIVERY_LEASE.presented(claim.message_id, claim.fence, claim.owner)


# --- transitions ----------------------------------------------------------------------------


@transition(one_statement_on=ON_POSTGRES)
def claim_messages_txn(
    conn: Connection, owner: str, limit: int, lease_seconds: float, channel: str | None = None
) -> list[MessageClaim]:
    """Lease up to ``limit`` due messages (or ones whose delivery lease expired), skipping rows
    another dispatcher has locked; each claim bumps the message's fence and attempt count."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput(f"limit must be a positive integer, got {limit!r}")
    if not owner or not owner.strip():
        raise InvalidInput("owner must be a non-empty string such as host:pid")
    given = {"owner": owner, "limit": limit, "channel": channel,
             "lease": check_seconds(lease_seconds, "lease")}
    if one_statement_writes(conn):
        rows = _CLAIM.rows(conn, **given)
        previous = {r["message_id"]: r["previous_status"] for r in rows}
    else:
        # BEGIN IMMEDIATE already holds the write lock: nobody can change these rows in between.
        previous = {r["message_id"]: r["status"] for r in _DUE.rows(conn, **given)}
        due = [{"message_id": message_id} for message_id in previous]
        rows = _CLAIM.rows(conn, **given, due=due) if due else []
    claims = [
        MessageClaim(
            message_id=r["message_id"], owner=owner, fence=r["fence"], attempt=r["attempts"],
            run_id=r["run_id"], channel=r["channel"], recipient=r["recipient"],
            subject=r["subject"], body=r["body"], headers=dict(r["headers"] or {}),
            created_at=r["created_at"], claimed_at=r["claimed_at"],
            previous_status=previous[r["message_id"]], payload=r["payload"],
        )
        for r in rows
    ]
    return sorted(claims, key=lambda c: (c.created_at, c.message_id))


def _record_outcome(conn: Connection, claim: MessageClaim, outcome: str, reply: Reply,
                    error: str, delay: float | None) -> None:
    attempt = {
        "message_id": claim.message_id, "attempt": claim.attempt, "owner": claim.owner,
        "started_at": claim.claimed_at, "outcome": outcome, "reply_code": reply.code,
        "reply_text": reply.text, "provider_message_id": reply.provider_message_id,
    }
    matched = _RECORD.first(conn, **{**_holder_params(claim), **attempt}, last_error=error,
                            delay=None if delay is None else check_seconds(delay, "delay"))
    if matched is None:
        raise _delivery_lease_lost(claim)
    if not one_statement_writes(conn):
        _RECORD_ATTEMPT.rows(conn, **attempt)


@transition(one_statement_on=ON_POSTGRES)
def mark_sent_txn(
    conn: Connection, sent: Sequence[tuple[MessageClaim, Reply]]
) -> list[MessageClaim]:
    """sending -> sent for each given message, only by its current lease holder, in one
    statement (PostgreSQL) or one locked transaction (SQLite); a message this very claim marked
    sent before (a retry after the reply to its commit was lost) counts as marked. Returns the
    claims whose lease had moved on: those rows are unchanged and no attempt is recorded."""
    if not sent:
        return []
    given = [{"message_id": c.message_id, "fence": c.fence, "owner": c.owner,
              "reply_code": r.code, "reply_text": r.text, "provider_message_id": r.provider_message_id}
             for c, r in sent]
    if not one_statement_writes(conn):
        _RECORD_SENT.rows(conn, sent=given)
    matched = {row["message_id"] for row in _MARK_SENT.rows(conn, sent=given)}
    unmatched = [claim for claim, _ in sent if claim.message_id not in matched]
    if unmatched:
        # Only then a read more (in autocommit on PostgreSQL: a sent row never changes again).
        mine = {row["message_id"] for row in _SENT_BY.rows(conn, sent=[
            {"message_id": c.message_id, "fence": c.fence, "owner": c.owner, "attempt": c.attempt}
            for c in unmatched])}
        unmatched = [claim for claim in unmatched if claim.message_id not in mine]
    return unmatched


@transition(one_statement_on=ON_POSTGRES)
def schedule_retry_txn(
    conn: Connection, claim: MessageClaim, delay_seconds: float, error: str, reply: Reply = NO_REPLY
) -> None:
    """sending -> retry, due again after ``delay_seconds`` by the database clock."""
    _record_outcome(conn, claim, "retry", reply, error, delay_seconds)


@transition(one_statement_on=ON_POSTGRES)
def mark_uncertain_txn(
    conn: Connection,
    claim: MessageClaim,
    error: str,
    retry_in_seconds: float | None,
    reply: Reply = NO_REPLY,
) -> None:
    """sending -> uncertain: the receiver may have it; due again (same key) only if a delay is given."""
    _record_outcome(conn, claim, "uncertain", reply, error, retry_in_seconds)


@transition(one_statement_on=ON_POSTGRES)
def mark_dead_txn(conn: Connection, claim: MessageClaim, error: str, reply: Reply = NO_REPLY) -> None:
    """sending -> dead: permanent rejection or limits exhausted; only an operator requeues it."""
    _record_outcome(conn, claim, "dead", reply, error, None)


@transition(one_statement_on=ON_POSTGRES)
def release_message_txn(conn: Connection, claim: MessageClaim) -> None:
    """Give back a claimed message that was never handed to a transport: it returns to the
    status it was claimed from, due now, and the try is not counted."""
    restored = claim.previous_status
    if restored not in DUE_STATUSES:
        # Taken over from an expired lease: its earlier holder's try already counts.
        restored = "pending" if claim.attempt <= 1 else "retry"
    _RELEASE.rows(conn, **_holder_params(claim), status=restored)


@transition(one_statement_on=ON_POSTGRES)
def requeue_message_txn(conn: Connection, message_id: str) -> QueuedMessage:
    """Operator action: a retry, uncertain or dead message is due now, with the same key."""
    row = _REQUEUE.first(conn, message_id=message_id)
    if row is None:
        current = get_message(conn, message_id)
        if current is None:
            raise MessageNotFound(f"no outbox message with id {message_id!r}")
        raise InvalidTransition(
            f"message {message_id} is {current.status}; only {', '.join(REQUEUEABLE)} can be requeued"
        )
    return message_from_row(row)
