"""Revisions: an operator-requested new output of a completed Run, as a new row linked to the
one it revises (never implicit); at most one revision of a Run is unfinished at a time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import db_now, insert_ignoring_conflicts
from store.errors import RevisionInProgress, RevisionRefused, RunNotFound
from store.identity import RunIdentity, params_fingerprint
from store.models import Run, runs_table
from store.run_reads import IDENTITY_COLUMNS, require_run, run_from_row
from store.statement import NOWHERE, Statement, insert_rows, param, transition

runs = runs_table


@dataclass(frozen=True)
class Revision:
    """A requested revision's Run (pending when new), and whether this request inserted it
    (False: the same request had, e.g. a retried revise flow run)."""

    run: Run
    new: bool


# --- statements: one name and one rule each (store/sql/<dialect>.sql shows what they send) ---

_LINEAGE = [c for c in runs.c if c.key not in ("raw_input", "output")]


def _revisions(d: str) -> sa.Select[Any]:
    given = runs.alias("given")
    return (sa.select(*_LINEAGE)
            .join_from(given, runs, sa.and_(*(runs.c[n] == given.c[n] for n in IDENTITY_COLUMNS)))
            .where(given.c.run_id == param(runs.c.run_id))
            .order_by(runs.c.revision))


_REVISIONS = Statement(
    "list_revisions", "Every revision of the logical run of the given Run (any of its "
    "revisions), oldest first, without documents.", _revisions)


def _request_revision(d: str) -> sa.Insert:
    """Insert revision N of a logical run, pending, only if its revision N - 1 is finished: a
    completed Run, or a revision given up; its stored raw input is copied from ``source`` (the
    latest completed revision) unless recollecting. Two requests of N clash on the identity
    key and the second inserts nothing."""
    source, prev = runs.alias("source"), runs.alias("prev")
    number = param(runs.c.revision)
    follows = param(runs.c.revises_run_id)
    finished = sa.exists(sa.select(prev.c.run_id).where(
        prev.c.run_id == follows, prev.c.revision == number - 1,
        sa.or_(prev.c.status == "completed",
               sa.and_(prev.c.status == "failed", prev.c.revision > 0))))
    raw = sa.case((sa.bindparam("recollect", type_=sa.Boolean()), sa.null()),
                  else_=source.c.raw_input)
    rows = sa.select(
        param(runs.c.run_id), source.c.job, source.c.subject, source.c.period_start,
        source.c.version, number, follows, param(runs.c.revision_reason), param(runs.c.resend),
        param(runs.c.requested_by), param(runs.c.params_fingerprint), param(runs.c.params), raw,
        sa.literal("pending"), sa.literal(0), sa.literal(0), db_now(), db_now(),
    ).where(source.c.run_id == param(runs.c.run_id, "source_run_id"), finished)
    return insert_rows(insert_ignoring_conflicts(d, runs),
        ["run_id", "job", "subject", "period_start", "version", "revision", "revises_run_id",
         "revision_reason", "resend", "requested_by", "params_fingerprint", "params", "raw_input",
         "status", "fence", "attempts", "created_at", "updated_at"], rows,
    ).returning(*runs.c)


_REQUEST_REVISION = Statement(
    "request_revision", "Insert the next revision of a logical run as pending, only if the "
    "revision before it is finished (at most one unfinished revision per Run); the identity "
    "key lets one of two concurrent requests win.", _request_revision)


# --- reads ----------------------------------------------------------------------------------


def list_revisions(conn: Connection, run_id: str) -> list[Run]:
    """Every revision of the logical run of ``run_id`` (any of its revisions' ids), oldest
    first, without raw inputs and outputs; ``RunNotFound`` if there is no such Run."""
    found = [run_from_row(row) for row in _REVISIONS.rows(conn, run_id=run_id)]
    if not found:
        raise RunNotFound(f"no run with id {run_id!r}")
    return found


def latest_completed(revisions: Sequence[Run]) -> Run | None:
    """The latest completed of a logical run's revisions (oldest first): its result."""
    return next((r for r in reversed(revisions) if r.status == "completed"), None)


# --- transitions ----------------------------------------------------------------------------


def _unfinished(base: Run, revision: Run) -> RevisionInProgress:
    return RevisionInProgress(
        f"run {base.run_id} has revision {revision.revision} (run {revision.run_id}) still "
        f"{revision.status}; at most one revision of a Run is unfinished at a time: wait for it "
        f"to finish, or resume it with `runledger runs revise {revision.run_id} --reason ...`")


def _not_completed(base: Run) -> RevisionRefused:
    what = {"failed": f"requeue it instead with `runledger runs requeue {base.run_id}`"}.get(
        base.status, "rerun its period instead (`runledger run JOB --period ...`, or Retry its "
                     "flow run); a revision redoes a completed result")
    return RevisionRefused(f"run {base.run_id} is {base.status}, never completed: only a "
                           f"completed Run can be revised; {what}")


@transition(one_statement_on=NOWHERE)
def request_revision_txn(conn: Connection, run_id: str, reason: str,
                         params: dict[str, Any] | None, recollect: bool, resend: bool,
                         requested_by: str | None) -> Revision:
    """Insert the next revision of a completed Run as pending, in one guarded statement: only
    when every earlier revision is finished (at most one unfinished revision per Run); the
    same request (``requested_by``) again returns its revision instead of asking for another."""
    revisions = list_revisions(conn, run_id)
    mine = [r for r in revisions if requested_by is not None and r.requested_by == requested_by]
    if mine:
        return Revision(mine[-1], new=False)
    base, latest = revisions[0], revisions[-1]
    if base.status != "completed":
        raise _not_completed(base)
    if latest.status not in ("completed", "failed"):
        raise _unfinished(base, latest)
    source = latest_completed(revisions)
    assert source is not None  # the base is completed
    if source.pruned_at is not None and not recollect:
        raise RevisionRefused(
            f"run {source.run_id}'s stored input was pruned on "
            f"{source.pruned_at.date().isoformat()} (`runledger prune`): a revision of it must "
            "collect its input again; pass --recollect")
    chosen = source.params if params is None else params
    identity = RunIdentity(base.job, base.subject, base.period_start, base.version,
                           latest.revision + 1)
    row = _REQUEST_REVISION.first(
        conn, run_id=identity.run_id, source_run_id=source.run_id, revision=identity.revision,
        revises_run_id=latest.run_id, revision_reason=reason, resend=resend,
        requested_by=requested_by,
        params_fingerprint=params_fingerprint(chosen), params=chosen or {},
        recollect=recollect)
    if row is not None:
        return Revision(run_from_row(row), new=True)
    # Another request inserted revision N first: it is the unfinished one now.
    winner = require_run(conn, identity.run_id)
    if requested_by is not None and winner.requested_by == requested_by:
        return Revision(winner, new=False)
    raise _unfinished(base, winner)
