"""Registration: a Run enters the ledger once per identity (pending) and is claimed, by one
owner at a time, under a lease judged by the database clock, each claim bumping its fence and
opening an Attempt; a tick registers and claims its Runs in one upsert. Each ``*_txn`` function
is one state transition; an identity registered with other parameters is a conflict."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from store.dialect import (
    db_now,
    insert_ignoring_conflicts,
    json_rows,
    json_timestamp,
    one_statement_writes,
    upsert,
)
from store.errors import InvalidInput, RunConflict
from store.identity import RunIdentity, params_fingerprint
from store.lease import Claim, Registration, lease_until
from store.models import Run, attempts_table, runs_table
from store.run_reads import get_runs, require_run, run_from_row
from store.statement import EVERYWHERE, ON_POSTGRES, Statement, insert_rows, param, transition
from store.validators import check_owner, check_seconds

runs = runs_table
attempts = attempts_table


_REGISTER = Statement(
    "register_run", "Insert the Run as pending, once per identity: an existing Run is left as "
    "it is (its parameters are compared by the caller).",
    lambda d: insert_ignoring_conflicts(d, runs)
    .values(
        run_id=param(runs.c.run_id), job=param(runs.c.job), subject=param(runs.c.subject),
        period_start=param(runs.c.period_start), version=param(runs.c.version),
        params_fingerprint=param(runs.c.params_fingerprint), params=param(runs.c.params),
        status="pending", fence=0, attempts=0, created_at=db_now(), updated_at=db_now(),
    )
    .returning(*runs.c)
)


def _take() -> sa.Update:
    return (
        sa.update(runs)
        .where(
            runs.c.run_id == param(runs.c.run_id),
            sa.or_(runs.c.status == "pending", runs.c.status == "running"),
            sa.or_(
                runs.c.lease_expires_at.is_(None),
                runs.c.lease_expires_at <= db_now(),
                runs.c.owner == param(runs.c.owner),
            ),
        )
        .values(
            fence=runs.c.fence + 1, owner=param(runs.c.owner), status="running",
            attempts=runs.c.attempts + 1, lease_expires_at=lease_until(), updated_at=db_now(),
        )
        .returning(runs.c.run_id, runs.c.fence, runs.c.lease_expires_at)
    )


def _close_attempts(run_id: sa.ColumnElement[Any]) -> sa.Update:
    return (
        sa.update(attempts)
        .where(attempts.c.run_id == run_id, attempts.c.finished_at.is_(None))
        .values(outcome="expired", finished_at=db_now())
    )


def _open_attempt_values() -> dict[str, Any]:
    return {"attempt_id": param(attempts.c.attempt_id), "owner": param(runs.c.owner),
            "started_at": db_now()}


def _claim(d: str) -> sa.Update | sa.Select[Any]:
    if d != "postgresql":
        return _take()  # the Attempt rows follow as statements of their own
    taken = _take().cte("taken")
    opened = _open_attempt_values()
    return sa.select(taken).add_cte(
        _close_attempts(taken.c.run_id).cte("closed"),
        insert_rows(postgresql.insert(attempts),
            ["attempt_id", "run_id", "owner", "fence", "started_at"],
            sa.select(opened["attempt_id"], taken.c.run_id, opened["owner"], taken.c.fence,
                      opened["started_at"]),
        ).cte("opened"),
    )


_CLAIM = Statement(
    "claim_run", "Take the lease of an unfinished Run whose lease is free, expired (database "
    "clock) or ours: bump the fence, count the attempt (PostgreSQL: and end the previous "
    "holder's Attempt and open this one's in the same statement).", _claim)
_CLOSE_ATTEMPTS = Statement(
    "close_attempts", "A new claim ends the previous holder's open Attempt: its lease expired or "
    "was taken over.", lambda d: _close_attempts(param(runs.c.run_id)), dialects=("sqlite",))
_OPEN_ATTEMPT = Statement(
    "open_attempt", "One Attempt row per successful claim, unique per (run, fence).",
    lambda d: sa.insert(attempts).values(
        run_id=param(runs.c.run_id), fence=param(runs.c.fence), **_open_attempt_values()
    ), dialects=("sqlite",))


_ENTERED = ("run_id", "job", "subject", "period_start", "version", "params_fingerprint", "params")


def _entries(d: str, one: bool) -> sa.Subquery:
    """The Runs to enter with their new attempt ids, from one JSON parameter: an object for one
    Run (so that PostgreSQL plans for one row and finds the old attempts by index), an array
    for a tick."""
    columns = [*(runs.c[n] for n in _ENTERED), attempts.c.attempt_id]
    return json_rows(d, "runs", columns, one=one).subquery("given")


def _enter(d: str, given: sa.Subquery) -> Any:
    """Insert each given Run already claimed, or claim the existing row when it is claimable
    and has the same parameters: register and claim as one upsert."""
    now = db_now()
    # Always a WHERE: SQLite cannot otherwise tell ON CONFLICT from a join's ON. Ordered by
    # run_id so that concurrent batches lock shared Runs in the same order (no deadlock).
    rows = sa.select(
        *(given.c[n] for n in _ENTERED), sa.literal("running"), sa.literal(1),
        param(runs.c.owner), sa.literal(1), lease_until(), now, now,
    ).where(sa.true()).order_by(given.c.run_id)
    insert = insert_rows(upsert(d, runs),
        [*_ENTERED, "status", "fence", "owner", "attempts", "lease_expires_at", "created_at",
         "updated_at"],
        rows,
    )
    proposed = insert.excluded
    return insert.on_conflict_do_update(
        index_elements=[runs.c.run_id],
        set_={
            "fence": runs.c.fence + 1, "owner": proposed.owner, "status": "running",
            "attempts": runs.c.attempts + 1, "lease_expires_at": proposed.lease_expires_at,
            "updated_at": proposed.updated_at,
        },
        where=sa.and_(
            sa.or_(runs.c.status == "pending", runs.c.status == "running"),
            sa.or_(
                runs.c.lease_expires_at.is_(None),
                runs.c.lease_expires_at <= db_now(),
                runs.c.owner == proposed.owner,
            ),
            runs.c.params_fingerprint == proposed.params_fingerprint,
        ),
    ).returning(*runs.c)


def _enter_with_attempts(d: str, one: bool) -> Any:
    given = _entries(d, one)
    if d != "postgresql":
        return _enter(d, given)  # the Attempt rows follow as statements of their own
    taken = _enter(d, given).cte("taken")
    return sa.select(taken).add_cte(
        _close_attempts(taken.c.run_id).cte("closed"),
        insert_rows(postgresql.insert(attempts),
            ["attempt_id", "run_id", "owner", "fence", "started_at"],
            sa.select(given.c.attempt_id, taken.c.run_id, taken.c.owner, taken.c.fence, db_now())
            .join_from(taken, given, given.c.run_id == taken.c.run_id),
        ).cte("opened"),
    )


_ENTER_RULE = (
    "Register and claim {what} in one upsert: a new Run is inserted claimed; an existing one is "
    "claimed only if it is claimable (as claim_run) and has the same parameters fingerprint "
    "(PostgreSQL: with its Attempt rows in the same statement).")
_ENTER_ONE = Statement(
    "enter_run", _ENTER_RULE.format(what="one Run, given as one JSON object,"),
    lambda d: _enter_with_attempts(d, one=True))
_ENTER_MANY = Statement(
    "enter_runs", _ENTER_RULE.format(what="a tick's Runs, given as one JSON array,"),
    lambda d: _enter_with_attempts(d, one=False))


@transition(one_statement_on=EVERYWHERE)
def register_txn(conn: Connection, identity: RunIdentity, params: dict[str, Any] | None) -> Run:
    """Insert the Run as pending or return the existing row; a different fingerprint is a conflict."""
    fingerprint = params_fingerprint(params)
    inserted = _REGISTER.first(
        conn, run_id=identity.run_id, job=identity.job, subject=identity.subject,
        period_start=identity.period_start, version=identity.version,
        params_fingerprint=fingerprint, params=params or {},
    )
    if inserted is not None:
        return run_from_row(inserted)
    existing = require_run(conn, identity.run_id)
    if existing.params_fingerprint != fingerprint:
        raise _conflict(identity, existing, fingerprint)
    return existing


@transition(one_statement_on=ON_POSTGRES)
def claim_txn(conn: Connection, run_id: str, owner: str, lease_seconds: float) -> Claim | None:
    """Take the lease if the Run is not finished and its lease is free, expired (database
    clock) or ours; bump the fence, count the attempt and open an Attempt row."""
    check_owner(owner)
    attempt_id = str(uuid.uuid4())
    lease = check_seconds(lease_seconds, "lease")
    given = {"run_id": run_id, "owner": owner, "lease": lease, "attempt_id": attempt_id}
    row = _CLAIM.first(conn, **given)
    if row is not None and not one_statement_writes(conn):
        _CLOSE_ATTEMPTS.rows(conn, run_id=run_id)
        _OPEN_ATTEMPT.rows(conn, **given, fence=row["fence"])
    if row is None:
        require_run(conn, run_id)
        return None
    return Claim(run_id, owner, row["fence"], attempt_id, row["lease_expires_at"])


def _conflict(identity: RunIdentity, existing: Run, fingerprint: str) -> RunConflict:
    return RunConflict(
        f"run {identity.run_id} ({identity.job}/{identity.subject}/"
        f"{identity.period_start.isoformat()}/{identity.version}) already exists with different "
        f"parameters (fingerprint {existing.params_fingerprint[:12]}, now {fingerprint[:12]}); "
        "bump the job version, or revise the Run with the new parameters: "
        f"`runledger runs revise {existing.run_id} --reason '...' --params '<JSON>'`"
    )


@transition(one_statement_on=ON_POSTGRES)
def register_and_claim_txn(
    conn: Connection,
    entries: Sequence[tuple[RunIdentity, dict[str, Any] | None]],
    owner: str,
    lease_seconds: float,
) -> dict[str, Registration]:
    """Register each Run and take its lease in one upsert: a new Run is inserted claimed; an
    existing one is claimed only if it is claimable (as ``claim_txn``) and has the same
    parameters; a different fingerprint is a conflict that writes nothing for that Run."""
    check_owner(owner)
    lease = check_seconds(lease_seconds, "lease")
    d = conn.dialect.name
    wanted: dict[str, tuple[RunIdentity, str, dict[str, Any]]] = {}
    for identity, params in entries:
        if not isinstance(identity, RunIdentity):
            raise InvalidInput(f"entries must hold RunIdentity objects, got {type(identity).__name__}")
        wanted.setdefault(identity.run_id, (identity, params_fingerprint(params), params or {}))
    if not wanted:
        return {}
    given: list[dict[str, Any]] = [
        {"run_id": run_id, "job": i.job, "subject": i.subject,
         "period_start": json_timestamp(d, i.period_start), "version": i.version,
         "params_fingerprint": fingerprint, "params": params, "attempt_id": str(uuid.uuid4())}
        for run_id, (i, fingerprint, params) in sorted(wanted.items())
    ]
    attempt_ids = {g["run_id"]: g["attempt_id"] for g in given}
    if len(given) == 1:
        taken = _ENTER_ONE.rows(conn, runs=given[0], owner=owner, lease=lease)
    else:
        taken = _ENTER_MANY.rows(conn, runs=given, owner=owner, lease=lease)
    if not one_statement_writes(conn):
        for row in taken:
            _CLOSE_ATTEMPTS.rows(conn, run_id=row["run_id"])
            _OPEN_ATTEMPT.rows(conn, run_id=row["run_id"], fence=row["fence"], owner=owner,
                               attempt_id=attempt_ids[row["run_id"]])
    found: dict[str, Registration] = {}
    for row in taken:
        run = run_from_row(row)
        found[run.run_id] = Registration(run, Claim(
            run.run_id, owner, run.fence, attempt_ids[run.run_id], row["lease_expires_at"]))
    left = [run_id for run_id in wanted if run_id not in found]
    existing = get_runs(conn, left) if left else {}
    for run_id in left:
        identity, fingerprint, _ = wanted[run_id]
        run = existing[run_id]
        conflict = None
        if run.params_fingerprint != fingerprint:
            conflict = _conflict(identity, run, fingerprint)
        found[run_id] = Registration(run, None, conflict)
    return {run_id: found[run_id] for run_id in wanted}
