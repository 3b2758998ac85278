"""The outbox: a completion queues its Run's messages here, and the dispatcher delivers them. A
message is claimed with a delivery lease and a fence; only the current holder can record the
outcome of its delivery attempt. Each ``*_txn`` is one transition (the caller owns the
transaction) over named statements (``store.statement``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import (
    db_now,
    insert_ignoring_conflicts,
    json_rows,
    one_statement_writes,
    skip_locked,
)
from store.errors import DeliveryLeaseLost, InvalidInput, InvalidTransition, MessageNotFound
from store.identity import message_key
from store.message import OutboxMessage
from store.models import (
    CLAIMABLE_WHERE,
    MAX_OWNER,
    DeliveryAttempt,
    QueuedMessage,
    delivery_attempts_table,
    outbox_table,
    runs_table,
)
from store.statement import (
    EVERYWHERE,
    NOWHERE,
    ON_POSTGRES,
    Statement,
    one_of,
    optional,
    param,
    transition,
)
from store.validators import check_seconds

outbox = outbox_table
deliveries = delivery_attempts_table

DUE_STATUSES = ("pending", "retry", "uncertain")
REQUEUEABLE = ("retry", "uncertain", "dead")
# A person's decision on a held message, and the status it leaves the message in.
DECIDED_STATUS = {"approved": "pending", "rejected": "rejected"}


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
class HeldMessage:
    """A message waiting for a person's decision, with the Run it belongs to."""

    message: QueuedMessage
    job: str
    subject: str
    period_start: datetime
    revision: int


@dataclass(frozen=True)
class Reply:
    """What the receiver or provider answered (all optional)."""

    code: int | None = None
    text: str | None = None
    provider_message_id: str | None = None


NO_REPLY = Reply()


# --- the queue: a completion's outbox rows (``store.runs.complete_txn`` queues them with the
# Run it completes, in the same statement on PostgreSQL) ---


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
    return insert_ignoring_conflicts(d, outbox).from_select(
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


def _holder() -> sa.ColumnElement[bool]:
    """The guard of every outcome: the message is sending under this exact fence and owner."""
    return sa.and_(
        outbox.c.message_id == param(outbox.c.message_id),
        outbox.c.fence == param(outbox.c.fence),
        outbox.c.lease_owner == param(outbox.c.lease_owner, "owner"),
        outbox.c.status == "sending",
    )


_ATTEMPT = ("message_id", "attempt", "owner", "started_at", "outcome", "reply_code",
            "reply_text", "provider_message_id")


def _record(d: str) -> Any:
    delay = sa.bindparam("delay", type_=sa.Float())
    update = (
        sa.update(outbox).where(_holder())
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
    recorded = sa.insert(deliveries).from_select(
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
    return sa.and_(
        outbox.c.message_id == given.c.message_id, outbox.c.fence == given.c.fence,
        outbox.c.lease_owner == given.c.owner,
        # Written as an expression so that SQLite looks each given row up by primary key
        # instead of looping over every 'sending' row through the status index.
        outbox.c.status.concat("") == "sending",
    )


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
    recorded = sa.insert(deliveries).from_select(_RECORDED, sa.select(
        updated.c.message_id, updated.c.attempts, updated.c.owner, updated.c.claimed_at,
        sa.literal("sent"), updated.c.reply_code, updated.c.reply_text,
        updated.c.provider_message_id, db_now(),
    )).cte("recorded")
    return sa.select(updated.c.message_id).add_cte(recorded)


def _record_held_as_sent(d: str) -> sa.Insert:
    given = json_rows(d, "sent", _SENT_GIVEN).subquery("given")
    return sa.insert(deliveries).from_select(_RECORDED, sa.select(
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
    lambda d: sa.update(outbox).where(_holder()).values(
        status=param(outbox.c.status), attempts=outbox.c.attempts - 1, lease_owner=sa.null(),
        lease_expires_at=sa.null(), next_attempt_at=db_now(), updated_at=db_now()))

_REQUEUE = Statement(
    "requeue_message", "Operator action: a retry, uncertain or dead message is due now, with "
    "the same key; no other status can be requeued.",
    lambda d: sa.update(outbox)
    .where(outbox.c.message_id == param(outbox.c.message_id), one_of(outbox.c.status, REQUEUEABLE))
    .values(status="pending", next_attempt_at=db_now(), updated_at=db_now())
    .returning(*outbox.c))

def _decide(d: str) -> sa.Update:
    given = json_rows(d, "decided", [outbox.c.message_id])
    now = db_now()
    return (
        sa.update(outbox)
        .where(outbox.c.message_id.in_(given), outbox.c.status == "held")
        .values(status=param(outbox.c.status), decision=param(outbox.c.decision),
                decided_by=param(outbox.c.decided_by), decision_reason=param(outbox.c.decision_reason),
                decided_at=now, next_attempt_at=now, updated_at=now)
        .returning(*outbox.c)
    )


_DECIDE = Statement(
    "decide_held_messages", "A person's decision on held messages: approved ones become "
    "pending, due now with their key; rejected ones are rejected, never sent; who, when and "
    "why are recorded; only a held message can be decided.", _decide)
_STATUSES_OF = Statement(
    "read_message_statuses", "The status of each of the given outbox messages that exists.",
    lambda d: sa.select(outbox.c.message_id, outbox.c.status)
    .where(outbox.c.message_id.in_(json_rows(d, "given", [outbox.c.message_id]))))

DEADLINE = "deadline"  # who decided when nobody did in time
DEADLINE_REASON = "no decision before the hold's deadline (the job's approval rejects then)"

_REJECT_OVERDUE = Statement(
    "reject_overdue_holds", "The job's held messages whose deadline passed (database clock) "
    "are rejected, by the deadline; never sent.",
    lambda d: sa.update(outbox)
    .where(outbox.c.status == "held", outbox.c.hold_until <= db_now(),
           outbox.c.run_id.in_(sa.select(runs_table.c.run_id)
                               .where(runs_table.c.job == param(runs_table.c.job))))
    .values(status="rejected", decision="rejected", decided_by=DEADLINE,
            decision_reason=DEADLINE_REASON, decided_at=db_now(), updated_at=db_now())
    .returning(*outbox.c))

_LIST_HELD = Statement(
    "list_held_messages", "Held messages, oldest first, with their Run's job, subject, period "
    "and revision, optionally of one job and one Run.",
    lambda d: sa.select(outbox, runs_table.c.job.label("run_job"),
                        runs_table.c.subject.label("run_subject"),
                        runs_table.c.period_start.label("run_period_start"),
                        runs_table.c.revision.label("run_revision"))
    .join(runs_table, runs_table.c.run_id == outbox.c.run_id)
    .where(outbox.c.status == "held", optional(runs_table.c.job), optional(outbox.c.run_id))
    .order_by(outbox.c.created_at, outbox.c.message_id)
    .limit(sa.bindparam("limit", type_=sa.Integer())))

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


def _message(row: dict[str, Any]) -> QueuedMessage:
    return QueuedMessage.model_validate(row)


def _delivery_lease_lost(claim: MessageClaim) -> DeliveryLeaseLost:
    return DeliveryLeaseLost(
        f"message {claim.message_id}: delivery fence {claim.fence} of {claim.owner} is no "
        "longer current; its outcome was not recorded"
    )


def _holder_params(claim: MessageClaim) -> dict[str, Any]:
    return {"message_id": claim.message_id, "fence": claim.fence, "owner": claim.owner}


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
    return _message(row)


@transition(one_statement_on=NOWHERE)
def decide_messages_txn(
    conn: Connection, message_ids: Sequence[str], decision: str, by: str, reason: str | None,
) -> list[QueuedMessage]:
    """A person's decision on held messages, all or none: approved ones become pending (due
    now, same key), rejected ones are never sent; the decision, who, when and why are recorded
    on each. A message that is unknown or not held refuses the whole decision."""
    if decision not in DECIDED_STATUS:
        raise InvalidInput(f"decision must be one of {', '.join(DECIDED_STATUS)}, got {decision!r}")
    if not isinstance(by, str) or not by.strip() or len(by) > MAX_OWNER:
        raise InvalidInput(f"who decides must be a name of 1 to {MAX_OWNER} characters, such as "
                           f"an operator's login, got {by!r}")
    if decision == "rejected" and (reason is None or not reason.strip()):
        raise InvalidInput("a rejection needs a reason (--reason TEXT): it is recorded with it")
    wanted = list(dict.fromkeys(message_ids))
    if not wanted:
        raise InvalidInput("no message to decide: give message ids, a run, or a job and period")
    given = [{"message_id": m} for m in wanted]
    found = {r["message_id"]: r["status"] for r in _STATUSES_OF.rows(conn, given=given)}
    missing = [m for m in wanted if m not in found]
    if missing:
        raise MessageNotFound(f"no outbox message with id {missing[0]!r}; nothing was decided")
    _refuse_unheld(found)
    rows = _DECIDE.rows(conn, decided=given, status=DECIDED_STATUS[decision], decision=decision,
                        decided_by=by.strip(), decision_reason=reason)
    if len(rows) != len(wanted):  # decided by someone else meanwhile: roll the whole one back
        decided = {r["message_id"] for r in rows}
        _refuse_unheld({r["message_id"]: r["status"] for r in _STATUSES_OF.rows(conn, given=given)
                        if r["message_id"] not in decided})
    return sorted((_message(r) for r in rows), key=lambda m: (m.created_at, m.message_id))


@transition(one_statement_on=EVERYWHERE)
def reject_overdue_holds_txn(conn: Connection, job: str) -> list[QueuedMessage]:
    """The job's held messages past their deadline are rejected by the deadline (recorded as
    decided by ``deadline``), never sent: for a job whose approval rejects an unanswered hold."""
    return [_message(r) for r in _REJECT_OVERDUE.rows(conn, job=job)]


def _refuse_unheld(statuses: dict[str, str]) -> None:
    for message_id, status in statuses.items():
        if status != "held":
            raise InvalidTransition(
                f"message {message_id} is {status}, not held: only a held message can be approved "
                "or rejected; nothing was decided")


# --- reads ----------------------------------------------------------------------------------


def get_message(conn: Connection, message_id: str) -> QueuedMessage | None:
    """The outbox message with this id, if any."""
    row = _GET.first(conn, message_id=message_id)
    return _message(row) if row else None


def list_messages(
    conn: Connection, *, status: str | None = None, run_id: str | None = None,
    channel: str | None = None, limit: int = 100,
) -> list[QueuedMessage]:
    """Outbox messages, oldest first."""
    return [_message(r) for r in _LIST.rows(conn, status=status, run_id=run_id, channel=channel,
                                            limit=limit)]


def list_recent_messages(
    conn: Connection, *, status: str | None = None, run_id: str | None = None,
    channel: str | None = None, limit: int = 100,
) -> list[QueuedMessage]:
    """The newest ``limit`` outbox messages, newest first (what a person looks at)."""
    return [_message(r) for r in _LIST_RECENT.rows(conn, status=status, run_id=run_id,
                                                   channel=channel, limit=limit)]


def list_held_messages(
    conn: Connection, *, job: str | None = None, period_start: datetime | None = None,
    run_id: str | None = None, limit: int = 1000,
) -> list[HeldMessage]:
    """Messages waiting for a person, oldest first, with their Runs' identity (of one job, one
    period start and one Run when given)."""
    rows = _LIST_HELD.rows(conn, job=job, run_id=run_id, limit=limit)
    found = [HeldMessage(_message({c.key: r[c.key] for c in outbox.c}), r["run_job"],
                         r["run_subject"], r["run_period_start"], r["run_revision"])
             for r in rows]
    return [h for h in found if period_start is None or h.period_start == period_start]


def list_delivery_attempts(conn: Connection, message_id: str) -> list[DeliveryAttempt]:
    """A message's delivery attempts, first try first."""
    return [DeliveryAttempt.model_validate(r)
            for r in _LIST_DELIVERIES.rows(conn, message_id=message_id)]


def count_messages(conn: Connection) -> dict[str, int]:
    """Messages per status (for summaries and the CLI)."""
    return {r["status"]: r["messages"] for r in _COUNT.rows(conn)}
