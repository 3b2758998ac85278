"""Reads of Runs and their Attempts: one Run or many by id, the latest Runs, the finished
Runs a rerun needs and the unfinished ones on-call reads (each with its kind), a Run's
Attempts. Each is one named statement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import json_rows
from store.errors import RunNotFound
from store.models import UNFINISHED_STATUSES, Attempt, Run, attempts_table, runs_table
from store.statement import Statement, one_of, optional, param

runs = runs_table
attempts = attempts_table

IDENTITY_COLUMNS = ("job", "subject", "period_start", "version")  # what a Run's revisions share
# How the error of a Run the budget released begins (flows.budgeting writes it): on-call tells
# an over-budget Run from one merely pending by it.
OVER_BUDGET_ERROR = "over budget: "
# What an unfinished Run is to on-call, judged at a moment ``now`` (``unfinished_kind``).
UNFINISHED_KINDS = ("held", "stranded", "waiting", "over-budget", "pending")


@dataclass(frozen=True)
class FinishedRun:
    """A completed or failed Run as a rerun of its tick reads it: what the subject's outcome
    needs, and not the raw input, which only an unfinished Run uses (a tick's inputs can be
    large)."""

    run_id: str
    status: str
    params_fingerprint: str
    attempts: int
    output: dict[str, Any] | None
    error: str | None
    revision: int = 0
    # A tombstone's: when retention pruned its output, and the output's sha256.
    pruned_at: datetime | None = None
    output_digest: str | None = None


@dataclass(frozen=True)
class UnfinishedRun:
    """A Run neither completed nor failed, as on-call reads it: where it stands (``kind``), who
    holds its lease and until when, its fence; not its documents."""

    run_id: str
    job: str
    subject: str
    period_start: datetime
    version: str
    revision: int
    status: str
    owner: str | None
    lease_expires_at: datetime | None
    fence: int
    attempts: int
    error: str | None
    updated_at: datetime | None
    kind: str


def unfinished_kind(status: str, lease_expires_at: datetime | None, error: str | None,
                    now: datetime) -> str:
    """What an unfinished Run is at ``now``: held (running on a lease that lasts past ``now``),
    stranded (running on a lease that ended), waiting (its model calls queued in a provider's
    batch), over-budget (pending, released by the budget) or pending (waiting for a claim)."""
    if status == "running":
        return "held" if lease_expires_at is not None and lease_expires_at > now else "stranded"
    if status == "waiting":
        return "waiting"
    return "over-budget" if (error or "").startswith(OVER_BUDGET_ERROR) else "pending"


def run_from_row(row: dict[str, Any]) -> Run:
    """The Run of a row the ledger read or returned."""
    # Rows come from our own table through typed result processing: no re-validation needed.
    return Run.model_construct(**row)


_GET = Statement(
    "get_run", "A Run by id.",
    lambda d: sa.select(runs).where(runs.c.run_id == param(runs.c.run_id)))

def _of_runs(d: str, *columns: Any) -> sa.Select[Any]:
    """``columns`` of the Runs whose ids are given as one JSON array of objects (``ids``): one
    statement for a tick of any size."""
    return sa.select(*columns).where(runs.c.run_id.in_(json_rows(d, "ids", [runs.c.run_id])))


_FINISHED = [runs.c[f.name] for f in fields(FinishedRun)]

_GET_MANY = Statement("get_runs", "Many Runs by id.", lambda d: _of_runs(d, runs))


def _finished(d: str) -> sa.Select[Any]:
    asked = runs.alias("asked")
    same_identity = sa.and_(*(runs.c[n] == asked.c[n] for n in IDENTITY_COLUMNS))
    return (
        sa.select(asked.c.run_id.label("asked_id"), *_FINISHED)
        .join_from(asked, runs, same_identity)
        .where(asked.c.run_id.in_(json_rows(d, "ids", [runs.c.run_id])),
               sa.or_(sa.and_(runs.c.revision == asked.c.revision,
                              one_of(runs.c.status, ("completed", "failed"))),
                      sa.and_(runs.c.revision > asked.c.revision, runs.c.status == "completed")))
    )


_GET_FINISHED = Statement(
    "get_finished_runs", "What a rerun needs of the completed and failed Runs among the given "
    "ids, and of their later completed revisions (the caller keeps the latest): not their raw "
    "inputs, which can be large.", _finished)


_LIST = Statement(
    "list_runs", "The latest Runs, newest period first, optionally of one job and one status.",
    lambda d: sa.select(runs).where(optional(runs.c.job), optional(runs.c.status))
    .order_by(runs.c.period_start.desc(), runs.c.subject)
    .limit(sa.bindparam("limit", type_=sa.Integer())))
_UNFINISHED = [runs.c[f.name] for f in fields(UnfinishedRun) if f.name != "kind"]
_LIST_UNFINISHED = Statement(
    "list_unfinished_runs", "Every Run neither completed nor failed (pending, running or "
    "waiting for its batch), "
    "optionally of one job, oldest period first, with its lease (owner, end) and fence: what "
    "on-call reads, without documents.",
    lambda d: sa.select(*_UNFINISHED)
    .where(optional(runs.c.job), one_of(runs.c.status, UNFINISHED_STATUSES))
    .order_by(runs.c.period_start, runs.c.job, runs.c.subject, runs.c.revision))
_LIST_ATTEMPTS = Statement(
    "list_attempts", "A Run's Attempts in claim (fence) order.",
    lambda d: sa.select(attempts).where(attempts.c.run_id == param(runs.c.run_id))
    .order_by(attempts.c.fence))
_LIST_ATTEMPTS_OF = Statement(
    "list_attempts_of_runs", "The Attempts of the Runs whose ids are given, per Run in claim "
    "(fence) order: one statement for a whole list of Runs.",
    lambda d: sa.select(attempts)
    .where(attempts.c.run_id.in_(json_rows(d, "ids", [attempts.c.run_id])))
    .order_by(attempts.c.run_id, attempts.c.fence))


# --- reads ----------------------------------------------------------------------------------


def get_run(conn: Connection, run_id: str) -> Run | None:
    """The Run with this id, if any."""
    row = _GET.first(conn, run_id=run_id)
    return run_from_row(row) if row else None


def require_run(conn: Connection, run_id: str) -> Run:
    """The Run with this id; ``RunNotFound`` if there is none."""
    run = get_run(conn, run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return run


def _ids(run_ids: Sequence[str]) -> list[dict[str, str]]:
    return [{"run_id": run_id} for run_id in run_ids]


def get_runs(conn: Connection, run_ids: Sequence[str]) -> dict[str, Run]:
    """Many Runs at once, by id."""
    return {row["run_id"]: run_from_row(row) for row in _GET_MANY.rows(conn, ids=_ids(run_ids))}


def get_finished_runs(conn: Connection, run_ids: Sequence[str]) -> dict[str, FinishedRun]:
    """The completed and failed Runs among ``run_ids``, each as its latest completed revision
    (the result for its job, subject and period), keyed by the id asked for (a rerun of a whole
    tick reads them all at once)."""
    found: dict[str, FinishedRun] = {}
    for row in _GET_FINISHED.rows(conn, ids=_ids(run_ids)):
        asked = row.pop("asked_id")
        if asked not in found or row["revision"] > found[asked].revision:
            found[asked] = FinishedRun(**row)
    return found


def list_runs(
    conn: Connection, *, job: str | None = None, status: str | None = None, limit: int = 100
) -> list[Run]:
    """The latest Runs, newest period first."""
    return [run_from_row(row) for row in _LIST.rows(conn, job=job, status=status, limit=limit)]


def list_unfinished_runs(conn: Connection, now: datetime,
                         job: str | None = None) -> list[UnfinishedRun]:
    """Every Run neither completed nor failed (of ``job``, if given), oldest period first,
    each with its kind at ``now``."""
    return [UnfinishedRun(**row, kind=unfinished_kind(row["status"], row["lease_expires_at"],
                                                      row["error"], now))
            for row in _LIST_UNFINISHED.rows(conn, job=job)]


def list_attempts(conn: Connection, run_id: str) -> list[Attempt]:
    """A Run's Attempts, oldest first."""
    return [Attempt.model_construct(**row) for row in _LIST_ATTEMPTS.rows(conn, run_id=run_id)]


def list_attempts_of(conn: Connection, run_ids: Sequence[str]) -> dict[str, list[Attempt]]:
    """The Attempts of each of ``run_ids`` (an empty list for a Run without any), oldest first."""
    found: dict[str, list[Attempt]] = {run_id: [] for run_id in run_ids}
    if run_ids:
        for row in _LIST_ATTEMPTS_OF.rows(conn, ids=_ids(run_ids)):
            found[row["run_id"]].append(Attempt.model_construct(**row))
    return found
