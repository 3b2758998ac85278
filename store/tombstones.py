"""Tombstones: what retention keeps of a pruned Run. ``prune_batch_txn`` turns at most N
completed Runs, completed before a cutoff and without an outbox message still to deliver, into
tombstones: the Run row stays (identity, status, fence, params fingerprint, attempt and model
call counts, completion time and ids, and now ``pruned_at`` and ``output_digest``), so that a
rerun of its period is still a duplicate; its documents (raw input, output, error, params) are
nulled, its model calls keep their cost but lose their answers, and its Attempts, its sent and
dead outbox rows, their delivery attempts and its settled alert occurrences are deleted; an
outbox row a person approved or rejected stays, as the record of that decision. Never touched:
a Run not completed (pending, running, failed: a failed Run awaits an operator), a Run with any
message pending, sending, retry, uncertain or held (skipped whole), a skip decision (it is what keeps a skipped period skipped), the per-day
suppressed counts (statistics, a row per job and day).

Batches walk the Runs in id order from a cursor (the primary key index), so a pass reads the
table once; each batch is one short transaction (a few row locks on PostgreSQL, the write lock
briefly on SQLite)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.call_tables import model_calls_table
from store.dialect import db_now, json_rows, stored_size
from store.errors import InvalidInput
from store.identity import document_digest, require_aware
from store.models import (
    UNFINISHED_STATUSES,
    attempts_table,
    delivery_attempts_table,
    occurrences_table,
    outbox_table,
    runs_table,
)
from store.statement import NOWHERE, Statement, one_of, transition

runs = runs_table
attempts = attempts_table
outbox = outbox_table
deliveries = delivery_attempts_table
occurrences = occurrences_table
calls = model_calls_table

FINAL_MESSAGE_STATUSES = ("sent", "dead")
# A held message awaits a person: its Run is not pruned until it is decided.
UNFINISHED_MESSAGE_STATUSES = ("pending", "sending", "retry", "uncertain", "held")
DOCUMENTS = ("raw_input", "output", "error", "params")
MAX_BATCH = 10_000  # Runs per transaction: beyond this a batch holds its locks too long


@dataclass(frozen=True)
class Pruned:
    """What one batch did: the Runs it made tombstones and the rows it deleted, the bytes of
    documents it nulled (as the database sizes them), and the cursor for the next batch (the
    last Run id of its window; None: no Run was left to look at)."""

    runs: int
    attempts: int
    outbox: int
    delivery_attempts: int
    occurrences: int
    document_bytes: int
    cursor: str | None


@dataclass(frozen=True)
class Prunable:
    """What a pass with the same cutoff and jobs would do (``--dry-run``), and the Runs before
    the cutoff it leaves alone, by why: completed with a message still to deliver, failed
    (awaiting an operator), not finished (pending or running), already tombstones."""

    runs: int
    attempts: int
    outbox: int
    delivery_attempts: int
    occurrences: int
    document_bytes: int
    unfinished_outbox: int
    failed: int
    unfinished: int
    tombstones: int


def _cutoff() -> sa.BindParameter[Any]:
    return sa.bindparam("cutoff", type_=runs.c.completed_at.type)


def _of_jobs(d: str) -> sa.ColumnElement[bool]:
    """The Run is of one of the jobs given as one JSON array (``jobs``)."""
    return runs.c.job.in_(json_rows(d, "jobs", [runs.c.job]))


def _unfinished_message(run_id: Any) -> sa.Exists:
    return sa.exists().where(outbox.c.run_id == run_id,
                             one_of(outbox.c.status, UNFINISHED_MESSAGE_STATUSES))


def _eligible(d: str) -> sa.ColumnElement[bool]:
    """A completed Run, not a tombstone yet, completed before the cutoff, of one of the given
    jobs, without a message still to deliver."""
    return sa.and_(runs.c.status == "completed", runs.c.pruned_at.is_(None),
                   runs.c.completed_at < _cutoff(), _of_jobs(d),
                   ~_unfinished_message(runs.c.run_id))


def _document_bytes() -> sa.ColumnElement[Any]:
    total: sa.ColumnElement[Any] = stored_size(runs.c[DOCUMENTS[0]])
    for name in DOCUMENTS[1:]:
        total = total + stored_size(runs.c[name])
    return total


_AFTER = sa.bindparam("after", type_=runs.c.run_id.type)
_UNTIL = sa.bindparam("until", type_=runs.c.run_id.type)

# A batch looks at the next ``limit`` Runs in id order (the primary key index), whatever
# their job or state, so that its reads are bounded as well as its writes, and a pass reads
# the table once, whatever the planner knows of it.
_WINDOW = Statement(
    "prune_window", "The id of the last of the next Runs in id order after the cursor (at most "
    "limit of them): the end of a prune batch's window.",
    lambda d: sa.select(sa.func.max(sa.literal_column("run_id")).label("until")).select_from(
        sa.select(runs.c.run_id).where(runs.c.run_id > _AFTER).order_by(runs.c.run_id)
        .limit(sa.bindparam("limit", type_=sa.Integer())).subquery("window")))


def _pick(d: str) -> sa.Select[Any]:
    query = (sa.select(runs.c.run_id, runs.c.output, _document_bytes().label("document_bytes"))
             .where(runs.c.run_id > _AFTER, runs.c.run_id <= _UNTIL, _eligible(d))
             .order_by(runs.c.run_id))
    # Locked in id order, like a tick's upsert locks its Runs: the two cannot deadlock.
    return query.with_for_update(of=runs) if d == "postgresql" else query


def _given(d: str) -> sa.Select[Any]:
    return json_rows(d, "ids", [runs.c.run_id])


_PICK = Statement(
    "pick_prunable_runs", "Lock the Runs of the batch's window (ids after the cursor, up to its "
    "end) that are completed before the cutoff, of the given jobs, not tombstones and without "
    "an outbox message still to deliver, with their outputs (to digest) and their documents' "
    "stored size.", _pick)
_LOCK_MESSAGES = Statement(
    "lock_pruned_messages", "Lock the outbox rows of the picked Runs and read their status "
    "again: a message requeued since the pick keeps its Run out of the batch.",
    lambda d: sa.select(outbox.c.run_id, outbox.c.status)
    .where(outbox.c.run_id.in_(_given(d))).with_for_update(),
    dialects=("postgresql",))
_DELETE_DELIVERIES = Statement(
    "delete_pruned_delivery_attempts", "Delete the delivery attempts of the pruned Runs' sent "
    "and dead messages.",
    lambda d: sa.delete(deliveries).where(deliveries.c.message_id.in_(
        sa.select(outbox.c.message_id).where(outbox.c.run_id.in_(_given(d)),
                                             one_of(outbox.c.status, FINAL_MESSAGE_STATUSES))))
    .returning(deliveries.c.id))
_DELETE_MESSAGES = Statement(
    "delete_pruned_messages", "Delete the pruned Runs' sent and dead outbox rows (never a "
    "message still to deliver, nor one a person decided: it is the decision's record).",
    lambda d: sa.delete(outbox).where(outbox.c.run_id.in_(_given(d)),
                                      one_of(outbox.c.status, FINAL_MESSAGE_STATUSES),
                                      outbox.c.decision.is_(None))
    .returning(outbox.c.message_id))
_DELETE_ATTEMPTS = Statement(
    "delete_pruned_attempts", "Delete the pruned Runs' Attempts.",
    lambda d: sa.delete(attempts).where(attempts.c.run_id.in_(_given(d)))
    .returning(attempts.c.attempt_id))

# A call's cost and tokens outlive the Run's documents (spend reports read them); its answer is
# a document, kept only to be reused by a later Attempt, which a completed Run never has.
_FORGET_ANSWERS = Statement(
    "forget_pruned_answers", "Null the answers of the pruned Runs' model calls; their cost, "
    "tokens and outcome stay.",
    lambda d: sa.update(calls).where(calls.c.run_id.in_(_given(d)), calls.c.answer.isnot(None))
    .values(answer=sa.null()).returning(calls.c.call_id))


def _settled_alert() -> sa.ColumnElement[bool]:
    """An occurrence that is no skip and whose every decision's event is known emitted."""
    return sa.and_(
        occurrences.c.skipped_at.is_(None),
        sa.or_(occurrences.c.overdue_at.is_(None), occurrences.c.overdue_emitted_at.isnot(None)),
        sa.or_(occurrences.c.recovered_at.is_(None),
               occurrences.c.recovered_emitted_at.isnot(None)),
        sa.or_(occurrences.c.gave_up_at.is_(None), occurrences.c.gave_up_emitted_at.isnot(None)),
    )


_DELETE_OCCURRENCES = Statement(
    "delete_pruned_occurrences", "Delete the pruned Runs' alert occurrences (overdue, "
    "recovered) whose events are known emitted; a skip decision is kept.",
    lambda d: sa.delete(occurrences).where(occurrences.c.run_id.in_(_given(d)), _settled_alert())
    .returning(occurrences.c.run_id))


def _bury(d: str) -> sa.Update:
    given = json_rows(d, "digests", [runs.c.run_id, runs.c.output_digest]).subquery("buried")
    return (
        sa.update(runs)
        .where(runs.c.run_id == given.c.run_id, runs.c.status == "completed",
               runs.c.pruned_at.is_(None))
        .values(output_digest=given.c.output_digest, pruned_at=db_now(), updated_at=db_now(),
                **{name: sa.null() for name in DOCUMENTS})
        .returning(runs.c.run_id)
    )


_BURY = Statement(
    "bury_runs", "Turn the picked completed Runs into tombstones: record their output digests "
    "and the prune time (database clock), null their raw input, output, error and params; "
    "identity, status, fence, fingerprint, counts and completion stay.", _bury)


def _count(d: str) -> sa.Select[Any]:
    picked = sa.select(runs.c.run_id, _document_bytes().label("size")).where(_eligible(d)).cte(
        "picked")
    ids = sa.select(picked.c.run_id)
    before = runs.c.created_at < _cutoff()

    def count(query: sa.Select[Any]) -> sa.ScalarSelect[Any]:
        return query.scalar_subquery()

    return sa.select(
        count(sa.select(sa.func.count()).select_from(picked)).label("runs"),
        count(sa.select(sa.func.count()).where(attempts.c.run_id.in_(ids))).label("attempts"),
        count(sa.select(sa.func.count()).where(outbox.c.run_id.in_(ids))).label("outbox"),
        count(sa.select(sa.func.count()).where(deliveries.c.message_id.in_(
            sa.select(outbox.c.message_id).where(outbox.c.run_id.in_(ids))))
        ).label("delivery_attempts"),
        count(sa.select(sa.func.count()).where(occurrences.c.run_id.in_(ids), _settled_alert())
              ).label("occurrences"),
        count(sa.select(sa.func.coalesce(sa.func.sum(picked.c.size), 0))).label("document_bytes"),
        count(sa.select(sa.func.count()).where(
            runs.c.status == "completed", runs.c.pruned_at.is_(None),
            runs.c.completed_at < _cutoff(), _of_jobs(d),
            _unfinished_message(runs.c.run_id))).label("unfinished_outbox"),
        count(sa.select(sa.func.count()).where(runs.c.status == "failed", before,
                                                _of_jobs(d))).label("failed"),
        count(sa.select(sa.func.count()).where(one_of(runs.c.status, UNFINISHED_STATUSES),
                                                before, _of_jobs(d))).label("unfinished"),
        count(sa.select(sa.func.count()).where(runs.c.pruned_at.isnot(None),
                                                _of_jobs(d))).label("tombstones"),
    )


_COUNT = Statement(
    "count_prunable", "What a prune pass with this cutoff and these jobs would make tombstones and "
    "delete (a dry run), and the Runs from before the cutoff it leaves alone, by why.", _count)


def check_batch(limit: int) -> int:
    """A batch size: 1 to ``MAX_BATCH`` Runs."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
        raise InvalidInput(f"batch size must be an integer from 1 to {MAX_BATCH}, got {limit!r}")
    return limit


def _jobs(jobs: Sequence[str]) -> list[dict[str, str]]:
    if isinstance(jobs, str) or not jobs or not all(isinstance(j, str) for j in jobs):
        raise InvalidInput(f"jobs must be a non-empty list of job names, got {jobs!r}")
    return [{"job": job} for job in jobs]


@transition(one_statement_on=NOWHERE)
def prune_batch_txn(conn: Connection, cutoff: datetime, jobs: Sequence[str], limit: int,
                    after: str = "") -> Pruned:
    """Make tombstones of the Runs among the next ``limit`` after the cursor ``after`` that
    are completed before ``cutoff``, of ``jobs``, with no message still to deliver: digest
    each output, delete its Attempts, final messages, their delivery attempts and settled
    alerts, null its documents and its model calls' answers."""
    require_aware(cutoff, "cutoff", InvalidInput)
    given = _jobs(jobs)
    window = _WINDOW.first(conn, after=after, limit=check_batch(limit))
    cursor = window["until"] if window else None
    if cursor is None:
        return Pruned(0, 0, 0, 0, 0, 0, None)
    picked = _PICK.rows(conn, cutoff=cutoff, jobs=given, after=after, until=cursor)
    ids = [{"run_id": row["run_id"]} for row in picked]
    if conn.dialect.name == "postgresql":
        # The pick read the outbox without locking it: an operator may have requeued a dead
        # message since. The Runs with one still to deliver stay out of this batch.
        busy = {row["run_id"] for row in _LOCK_MESSAGES.rows(conn, ids=ids)
                if row["status"] in UNFINISHED_MESSAGE_STATUSES}
        if busy:
            picked = [row for row in picked if row["run_id"] not in busy]
            ids = [{"run_id": row["run_id"]} for row in picked]
    if not picked:
        return Pruned(0, 0, 0, 0, 0, 0, cursor)
    deleted = [len(s.rows(conn, ids=ids)) for s in
               (_DELETE_DELIVERIES, _DELETE_MESSAGES, _DELETE_ATTEMPTS, _DELETE_OCCURRENCES)]
    digests = [{"run_id": row["run_id"],
                "output_digest": document_digest(row["output"] or {}, "output")}
               for row in picked]
    _FORGET_ANSWERS.rows(conn, ids=ids)
    buried = _BURY.rows(conn, digests=digests)
    return Pruned(len(buried), deleted[2], deleted[1], deleted[0], deleted[3],
                  sum(int(row["document_bytes"] or 0) for row in picked), cursor)


def count_prunable(conn: Connection, cutoff: datetime, jobs: Sequence[str]) -> Prunable:
    """What ``prune_batch_txn`` batches with ``cutoff`` and ``jobs`` would do, without writing."""
    require_aware(cutoff, "cutoff", InvalidInput)
    row = _COUNT.first(conn, cutoff=cutoff, jobs=_jobs(jobs))
    assert row is not None
    return Prunable(**{k: int(v or 0) for k, v in row.items()})
