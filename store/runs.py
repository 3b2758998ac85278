"""Run transitions. Each ``*_txn`` function is one state transition: it takes an open
connection, never commits (the caller owns the transaction), states its rule in one line and
declares where it is one statement (``@transition``).

Every transition is one guarded named statement (``store.statement``); on PostgreSQL the
follow-up writes of a transition (the Attempt row, the outbox rows) ride in the same statement
as data-modifying CTEs, so a transition is one round trip (``one_statement_writes``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection
from sqlmodel import Session

from store.completion import UNRECORDED, CompletedBy, Completion, Effect
from store.dialect import (
    db_now,
    insert_ignoring_conflicts,
    json_rows,
    json_timestamp,
    one_statement_writes,
    upsert,
)
from store.errors import InvalidInput, InvalidTransition, LeaseLost, RunConflict, RunNotFound
from store.identity import RunIdentity, params_fingerprint
from store.lease import Claim, Registration
from store.message import OutboxMessage
from store.models import Attempt, Run, attempts_table, runs_table
from store.outbox import message_rows, queue, queue_messages
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
from store.validators import check_calls, check_owner, check_seconds

runs = runs_table
attempts = attempts_table

IDENTITY_COLUMNS = ("job", "subject", "period_start", "version")  # what a Run's revisions share
# How the error of a Run the budget released begins (flows.budgeting writes it): on-call tells
# an over-budget Run from one merely pending by it.
OVER_BUDGET_ERROR = "over budget: "
# What an unfinished Run is to on-call, judged at a moment ``now`` (``unfinished_kind``).
UNFINISHED_KINDS = ("held", "stranded", "over-budget", "pending")


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
    stranded (running on a lease that ended), over-budget (pending, released by the budget) or
    pending (waiting for a claim)."""
    if status == "running":
        return "held" if lease_expires_at is not None and lease_expires_at > now else "stranded"
    return "over-budget" if (error or "").startswith(OVER_BUDGET_ERROR) else "pending"


def run_from_row(row: dict[str, Any]) -> Run:
    """The Run of a row the ledger read or returned."""
    # Rows come from our own table through typed result processing: no re-validation needed.
    return Run.model_construct(**row)


def _holder() -> sa.ColumnElement[bool]:
    """The guard of every worker write: the Run is running under this exact fence and owner."""
    return sa.and_(
        runs.c.run_id == param(runs.c.run_id),
        runs.c.fence == param(runs.c.fence),
        runs.c.owner == param(runs.c.owner),
        runs.c.status == "running",
    )


def _lease_until() -> sa.ColumnElement[Any]:
    return db_now(sa.bindparam("lease", type_=sa.Float()))


def _holder_params(claim: Claim) -> dict[str, Any]:
    return {"run_id": claim.run_id, "fence": claim.fence, "owner": claim.owner}


def _stale_fence(claim: Claim, run: Run | None = None) -> LeaseLost:
    now = f" (now fence {run.fence}, owner {run.owner}, status {run.status})" if run else ""
    return LeaseLost(
        f"run {claim.run_id}: fence {claim.fence} of {claim.owner} is no longer current{now}"
    )


# --- statements: one name and one rule each (store/sql/<dialect>.sql shows what they send) ---

_GET = Statement(
    "get_run", "A Run by id.",
    lambda d: sa.select(runs).where(runs.c.run_id == param(runs.c.run_id)))

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
            attempts=runs.c.attempts + 1, lease_expires_at=_lease_until(), updated_at=db_now(),
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
        postgresql.insert(attempts).from_select(
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
        param(runs.c.owner), sa.literal(1), _lease_until(), now, now,
    ).where(sa.true()).order_by(given.c.run_id)
    insert = upsert(d, runs).from_select(
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
        postgresql.insert(attempts).from_select(
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

_RENEW_MANY = Statement(
    "renew_leases", "Extend the lease of every given Run still held under its fence and owner, "
    "from the database clock; a Run whose fence moved on is left out.",
    lambda d: sa.update(runs)
    .where(
        sa.tuple_(runs.c.run_id, runs.c.fence, runs.c.owner).in_(
            json_rows(d, "claims", [runs.c.run_id, runs.c.fence, runs.c.owner])
        ),
        runs.c.status == "running",
    )
    .values(lease_expires_at=_lease_until(), updated_at=db_now())
    .returning(runs.c.run_id, runs.c.lease_expires_at)
)

_SAVE_INPUT = Statement(
    "save_input", "Store the raw input once (the first writer's value stays) and return the "
    "stored one; only the current fence holder can.",
    lambda d: sa.update(runs).where(_holder())
    .values(raw_input=sa.func.coalesce(runs.c.raw_input, param(runs.c.raw_input)), updated_at=db_now())
    .returning(runs.c.raw_input)
)


def _more_calls() -> sa.ColumnElement[Any]:
    """The Run's model calls plus those of the Attempt that ends now."""
    return runs.c.model_calls + param(runs.c.model_calls)


def _accept() -> sa.Update:
    return (
        sa.update(runs).where(_holder())
        .values(
            status="completed", output=param(runs.c.output), owner=sa.null(),
            lease_expires_at=sa.null(), error=sa.null(), completed_at=db_now(), updated_at=db_now(),
            completed_attempt_id=param(attempts.c.attempt_id), model_calls=_more_calls(),
            completed_flow_run_id=param(runs.c.completed_flow_run_id),
            completed_task_run_id=param(runs.c.completed_task_run_id),
        )
        .returning(*runs.c)
    )


def _finish_attempt() -> sa.Update:
    return (
        sa.update(attempts).where(attempts.c.attempt_id == param(attempts.c.attempt_id))
        .values(outcome=sa.bindparam("outcome", type_=attempts.c.outcome.type),
                error=param(attempts.c.error), model_calls=param(attempts.c.model_calls),
                finished_at=db_now())
    )


def _complete(d: str) -> sa.Update | sa.Select[Any]:
    if d != "postgresql":
        return _accept()  # the outbox rows and the Attempt's end follow as statements
    accepted = _accept().cte("accepted")
    if_accepted = sa.exists(sa.select(accepted.c.run_id))
    return sa.select(accepted).add_cte(
        _finish_attempt().where(if_accepted).cte("finished"), queue(d, if_accepted).cte("queued")
    )


_COMPLETE = Statement(
    "complete_run", "Accept the output, clear the lease, add the Attempt's model calls and "
    "record the flow run and task run that completed it; only the current fence holder can "
    "(PostgreSQL: with the outbox rows and the Attempt's end in the same statement, written "
    "only if the Run was accepted).", _complete)
_FINISH_ATTEMPT = Statement(
    "finish_attempt", "End the Attempt with its outcome (completed, released, failed), error "
    "and model calls.",
    lambda d: _finish_attempt())

_RELEASE_OR_FAIL = Statement(
    "release_or_fail_run", "Record the error, add the Attempt's model calls and clear the "
    "lease, the Run going back to pending (retryable) or to failed; only the current fence "
    "holder can.",
    lambda d: sa.update(runs).where(_holder())
    .values(status=param(runs.c.status), owner=sa.null(), lease_expires_at=sa.null(),
            error=param(runs.c.error), model_calls=_more_calls(), updated_at=db_now())
    .returning(*runs.c)
)

_REQUEUE = Statement(
    "requeue_run", "Operator action: a failed Run goes back to pending; no other status can.",
    lambda d: sa.update(runs)
    .where(runs.c.run_id == param(runs.c.run_id), runs.c.status == "failed")
    .values(status="pending", updated_at=db_now())
    .returning(*runs.c)
)


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
    "list_unfinished_runs", "Every Run neither completed nor failed (pending or running), "
    "optionally of one job, oldest period first, with its lease (owner, end) and fence: what "
    "on-call reads, without documents.",
    lambda d: sa.select(*_UNFINISHED)
    .where(optional(runs.c.job), one_of(runs.c.status, ("pending", "running")))
    .order_by(runs.c.period_start, runs.c.job, runs.c.subject, runs.c.revision))
_TAKE_OVER = Statement(
    "take_over_run", "Operator action: a running Run (the one given, or every one the given "
    "owner holds) goes back to pending, its lease cleared and its fence raised by one, so that "
    "the holder's next write is refused, whether its lease had expired or not; its error says "
    "whose lease was taken over and why.",
    lambda d: sa.update(runs)
    .where(optional(runs.c.run_id), optional(runs.c.owner), runs.c.status == "running")
    .values(status="pending", fence=runs.c.fence + 1, owner=sa.null(),
            lease_expires_at=sa.null(), updated_at=db_now(),
            error=sa.literal("lease of ", sa.Text) + runs.c.owner
            + sa.literal(" taken over: ", sa.Text) + sa.bindparam("reason", type_=sa.Text))
    .returning(*runs.c))
_END_TAKEN_OVER = Statement(
    "end_taken_over_attempt", "The Attempt of a Run taken over (its claim's fence) ends "
    "released, with the reason.",
    lambda d: sa.update(attempts)
    .where(attempts.c.run_id == param(attempts.c.run_id),
           attempts.c.fence == param(attempts.c.fence), attempts.c.finished_at.is_(None))
    .values(outcome="released", error=param(attempts.c.error), finished_at=db_now()))
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


# --- transitions ----------------------------------------------------------------------------


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


@transition(one_statement_on=EVERYWHERE)
def renew_many_txn(conn: Connection, claims: Sequence[Claim], lease_seconds: float) -> dict[str, datetime]:
    """Extend every still-held lease from the database clock in one statement; a claim whose
    fence moved on is left out of the result (its lease is lost)."""
    lease = check_seconds(lease_seconds, "lease")
    if not claims:
        return {}
    given = [{"run_id": c.run_id, "fence": c.fence, "owner": c.owner} for c in claims]
    rows = _RENEW_MANY.rows(conn, claims=given, lease=lease)
    return {row["run_id"]: row["lease_expires_at"] for row in rows}


@transition(one_statement_on=EVERYWHERE)
def save_input_txn(conn: Connection, claim: Claim, raw: dict[str, Any]) -> dict[str, Any]:
    """Store the raw input once (first writer wins) and return the stored value; fence holder only."""
    row = _SAVE_INPUT.first(conn, **_holder_params(claim), raw_input=raw)
    if row is None:
        raise _stale_fence(claim, get_run(conn, claim.run_id))
    return row["raw_input"]  # type: ignore[no-any-return]


@transition(one_statement_on=ON_POSTGRES)
def complete_txn(
    conn: Connection,
    claim: Claim,
    output: dict[str, Any],
    messages: Sequence[OutboxMessage] = (),
    by: CompletedBy = UNRECORDED,
) -> Completion:
    """Accept the output, clear the lease and queue the outbox rows together; only the fence
    holder can; a Run completed by someone else is returned unchanged."""
    rows = message_rows(claim.run_id, messages)
    given = {**_holder_params(claim), "output": output, "attempt_id": claim.attempt_id,
             "outcome": "completed", "error": None, **by.params()}
    row = _COMPLETE.first(conn, **given, messages=rows)
    if row is not None and not one_statement_writes(conn):
        queue_messages(conn, rows)
        _FINISH_ATTEMPT.rows(conn, **given)
    if row is None:
        run = require_run(conn, claim.run_id)
        if run.status != "completed":
            raise _stale_fence(claim, run)
        return Completion(run, new=False)
    return Completion(run_from_row(row), new=True)


@transition(one_statement_on=NOWHERE)
def complete_with_effect_txn(
    conn: Connection,
    claim: Claim,
    output: dict[str, Any],
    messages: Sequence[OutboxMessage],
    effect: Effect,
    by: CompletedBy = UNRECORDED,
) -> Completion:
    """Complete the Run as ``complete_txn`` and apply the job's business effect in the same
    transaction: both commit or neither does; a Run completed before gets no effect."""
    done = complete_txn(conn, claim, output, messages, by)
    if done.new:
        with Session(bind=conn) as session:
            effect(session, output)
            session.flush()
    return done


@transition(one_statement_on=NOWHERE)
def fail_txn(conn: Connection, claim: Claim, error: str, retryable: bool,
             model_calls: int = 0) -> Run:
    """Record the error and the Attempt's model calls; a retryable failure releases the lease
    (pending), a permanent one marks the Run failed; only the fence holder can do either."""
    calls = check_calls(model_calls)
    row = _RELEASE_OR_FAIL.first(
        conn, **_holder_params(claim), status="pending" if retryable else "failed", error=error,
        model_calls=calls,
    )
    if row is None:
        raise _stale_fence(claim, get_run(conn, claim.run_id))
    _FINISH_ATTEMPT.rows(
        conn, attempt_id=claim.attempt_id, outcome="released" if retryable else "failed",
        error=error, model_calls=calls,
    )
    return run_from_row(row)


@transition(one_statement_on=NOWHERE)
def requeue_run_txn(conn: Connection, run_id: str) -> Run:
    """Operator action: a failed Run goes back to pending; no other state can be requeued."""
    row = _REQUEUE.first(conn, run_id=run_id)
    if row is None:
        run = require_run(conn, run_id)
        raise InvalidTransition(f"run {run_id} is {run.status}; only a failed run can be requeued")
    return run_from_row(row)


@transition(one_statement_on=NOWHERE)
def take_over_txn(conn: Connection, reason: str, *, run_id: str | None = None,
                  owner: str | None = None) -> list[Run]:
    """Operator action: a running Run (by id, or every one ``owner`` holds) goes pending with
    its fence raised by one and its Attempt ended released; nothing else can be taken over."""
    if (run_id is None) == (owner is None):
        raise InvalidInput("take over one Run by its id, or the Runs of one owner, not both "
                           "nor neither")
    taken = [run_from_row(row) for row in
             _TAKE_OVER.rows(conn, run_id=run_id, owner=owner, reason=reason)]
    for run in taken:
        _END_TAKEN_OVER.rows(conn, run_id=run.run_id, fence=run.fence - 1, error=run.error)
    if taken:
        return taken
    if owner is not None:
        raise InvalidTransition(f"no running Run is leased by {owner!r}: nothing to release "
                                "(`runledger status` lists who holds which Run)")
    assert run_id is not None
    found = require_run(conn, run_id)
    raise InvalidTransition(f"run {run_id} is {found.status} and holds no lease: nothing to "
                            "release" + ("" if found.status == "completed" else
                                         " (`runledger runs show` tells its state)"))
