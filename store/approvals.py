"""Approvals: a message queued held waits for a person's decision: approved, it becomes pending
(due now, same key); rejected, it is never sent; a job's approval can reject the holds nobody
decided before their deadline. Who, when and why are recorded on each message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import db_now, json_rows
from store.errors import InvalidInput, InvalidTransition, MessageNotFound
from store.models import MAX_OWNER, QueuedMessage, outbox_table, runs_table
from store.outbox_reads import message_from_row
from store.statement import EVERYWHERE, NOWHERE, Statement, optional, param, transition

outbox = outbox_table

# A person's decision on a held message, and the status it leaves the message in.
DECIDED_STATUS = {"approved": "pending", "rejected": "rejected"}


@dataclass(frozen=True)
class HeldMessage:
    """A message waiting for a person's decision, with the Run it belongs to."""

    message: QueuedMessage
    job: str
    subject: str
    period_start: datetime
    revision: int


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
    return sorted((message_from_row(r) for r in rows), key=lambda m: (m.created_at, m.message_id))


@transition(one_statement_on=EVERYWHERE)
def reject_overdue_holds_txn(conn: Connection, job: str) -> list[QueuedMessage]:
    """The job's held messages past their deadline are rejected by the deadline (recorded as
    decided by ``deadline``), never sent: for a job whose approval rejects an unanswered hold."""
    return [message_from_row(r) for r in _REJECT_OVERDUE.rows(conn, job=job)]


def _refuse_unheld(statuses: dict[str, str]) -> None:
    for message_id, status in statuses.items():
        if status != "held":
            raise InvalidTransition(
                f"message {message_id} is {status}, not held: only a held message can be approved "
                "or rejected; nothing was decided")


def list_held_messages(
    conn: Connection, *, job: str | None = None, period_start: datetime | None = None,
    run_id: str | None = None, limit: int = 1000,
) -> list[HeldMessage]:
    """Messages waiting for a person, oldest first, with their Runs' identity (of one job, one
    period start and one Run when given)."""
    rows = _LIST_HELD.rows(conn, job=job, run_id=run_id, limit=limit)
    found = [HeldMessage(message_from_row({c.key: r[c.key] for c in outbox.c}), r["run_job"],
                         r["run_subject"], r["run_period_start"], r["run_revision"])
             for r in rows]
    return [h for h in found if period_start is None or h.period_start == period_start]
