"""Operational statistics: the one count the ledger keeps for them (per job and UTC day, the Runs
a tick asked for again that were completed or leased elsewhere: duplicates suppressed) and the
reads that ``runledger stats`` aggregates (no documents, times only)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import db_now, upsert
from store.errors import InvalidInput
from store.models import attempts_table, outbox_table, runs_table, suppressed_counts_table
from store.statement import EVERYWHERE, Statement, optional, param, transition

runs = runs_table
attempts = attempts_table
outbox = outbox_table
suppressed = suppressed_counts_table


@dataclass(frozen=True)
class Activity:
    """What happened from a moment on, as rows of plain values: the Runs completed (job,
    completed_at, attempts, revision), the Attempts (job, started_at, finished_at, outcome, model_calls),
    the outbox messages (job, created_at, status) and the suppressed counts (job, day,
    duplicates, in_progress_elsewhere)."""

    completed: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    suppressed: list[dict[str, Any]]


def _count_suppressed(d: str) -> Any:
    insert = upsert(d, suppressed).values(
        job=param(suppressed.c.job), day=param(suppressed.c.day),
        duplicates=param(suppressed.c.duplicates),
        in_progress_elsewhere=param(suppressed.c.in_progress_elsewhere), updated_at=db_now())
    return insert.on_conflict_do_update(
        index_elements=[suppressed.c.job, suppressed.c.day],
        set_={"duplicates": suppressed.c.duplicates + insert.excluded.duplicates,
              "in_progress_elsewhere": suppressed.c.in_progress_elsewhere
              + insert.excluded.in_progress_elsewhere,
              "updated_at": insert.excluded.updated_at})


_COUNT_SUPPRESSED = Statement(
    "count_suppressed", "Add one tick's Runs asked for again (completed: duplicates; leased by "
    "another worker: in progress elsewhere) to its job's counts for the UTC day.",
    _count_suppressed)

_SINCE = sa.bindparam("since", type_=runs.c.completed_at.type)
_COMPLETED_SINCE = Statement(
    "read_completed_since", "The Runs completed from a moment on (optionally of one job): job, "
    "completion time, attempts and revision number, no documents.",
    lambda d: sa.select(runs.c.job, runs.c.completed_at, runs.c.attempts, runs.c.revision)
    .where(runs.c.status == "completed", runs.c.completed_at >= _SINCE, optional(runs.c.job)))
_ATTEMPTS_SINCE = Statement(
    "read_attempts_since", "The Attempts started or ended from a moment on (optionally of one "
    "job's Runs): times, outcome and model calls.",
    lambda d: sa.select(runs.c.job, attempts.c.started_at, attempts.c.finished_at,
                        attempts.c.outcome, attempts.c.model_calls)
    .join_from(attempts, runs, runs.c.run_id == attempts.c.run_id)
    .where(sa.or_(attempts.c.started_at >= _SINCE, attempts.c.finished_at >= _SINCE),
           optional(runs.c.job)))
_MESSAGES_SINCE = Statement(
    "read_messages_since", "The outbox messages queued from a moment on (optionally of one "
    "job's Runs): queue time and status.",
    lambda d: sa.select(runs.c.job, outbox.c.created_at, outbox.c.status)
    .join_from(outbox, runs, runs.c.run_id == outbox.c.run_id)
    .where(outbox.c.created_at >= _SINCE, optional(runs.c.job)))
_SUPPRESSED_SINCE = Statement(
    "read_suppressed_since", "The suppressed counts from a UTC day on (optionally of one job).",
    lambda d: sa.select(suppressed.c.job, suppressed.c.day, suppressed.c.duplicates,
                        suppressed.c.in_progress_elsewhere)
    .where(suppressed.c.day >= param(suppressed.c.day), optional(suppressed.c.job)))


def _check_count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name} must be an integer of 0 or more, got {value!r}")
    return value


@transition(one_statement_on=EVERYWHERE)
def count_suppressed_txn(conn: Connection, job: str, day: date, duplicates: int,
                         in_progress_elsewhere: int) -> None:
    """Add one tick's Runs asked for again to the job's counts for ``day`` (UTC)."""
    _COUNT_SUPPRESSED.rows(conn, job=job, day=day,
                           duplicates=_check_count(duplicates, "duplicates"),
                           in_progress_elsewhere=_check_count(in_progress_elsewhere,
                                                              "in_progress_elsewhere"))


def read_activity(conn: Connection, since: datetime, job: str | None = None) -> Activity:
    """Everything ``runledger stats`` counts from ``since`` on, optionally of one job."""
    return Activity(
        completed=_COMPLETED_SINCE.rows(conn, since=since, job=job),
        attempts=_ATTEMPTS_SINCE.rows(conn, since=since, job=job),
        messages=_MESSAGES_SINCE.rows(conn, since=since, job=job),
        suppressed=_SUPPRESSED_SINCE.rows(conn, day=since.date(), job=job),
    )
