"""Run transitions. Each ``*_txn`` function is one state transition: it takes an open
connection, never commits (the caller owns the transaction) and states its rule in one line.

Every transition is one guarded statement (a ``Prepared`` one, built once per dialect); on
PostgreSQL the follow-up writes of a transition (the Attempt row, the outbox rows) ride in the
same statement as data-modifying CTEs, so a transition is one round trip."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection
from sqlmodel import Session

from store.dialect import (
    check_seconds,
    db_now,
    insert_ignoring_conflicts,
    is_postgres,
    json_rows,
    json_timestamp,
    upsert,
)
from store.errors import (
    AmbiguousId,
    InvalidInput,
    InvalidTransition,
    LeaseLost,
    OutputTooLarge,
    RunConflict,
    RunledgerError,
    RunNotFound,
)
from store.identity import RunIdentity, canonical_json, message_key, params_fingerprint
from store.message import OutboxMessage
from store.models import (
    MAX_OWNER,
    Attempt,
    Run,
    attempts_table,
    outbox_table,
    runs_table,
)
from store.prepared import Prepared

runs = runs_table
attempts = attempts_table
outbox = outbox_table


# A business effect committed atomically with a completion (seed 003's daily credit): it gets a
# Session on the completion's own transaction.
Effect = Callable[[Session], None]


@dataclass(frozen=True)
class Claim:
    """Proof of holding a Run's lease: every write presents (run_id, owner, fence)."""

    run_id: str
    owner: str
    fence: int
    attempt_id: str
    lease_expires_at: datetime


@dataclass(frozen=True)
class Registration:
    """What register+claim found for one identity: the Run, the claim when this owner holds
    it now, and the conflict when the identity exists with other parameters (nothing written)."""

    run: Run
    claim: Claim | None
    conflict: RunConflict | None = None


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


@dataclass(frozen=True)
class Completion:
    """The completed Run and whether this call completed it (False: someone else had)."""

    run: Run
    new: bool


def json_document(value: Any, what: str, max_bytes: int) -> dict[str, Any]:
    """A JSON object within ``max_bytes`` when serialized; anything else is refused."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a dict (a JSON object), got {type(value).__name__}")
    size = len(canonical_json(value, what).encode("utf-8"))
    if size > max_bytes:
        raise OutputTooLarge(f"{what} is {size} bytes, above the configured limit of {max_bytes} bytes")
    return value


def error_text(error: str) -> str:
    """A failure's error as storable text: required, and NUL (refused by PostgreSQL) escaped."""
    if not isinstance(error, str) or not error.strip():
        raise InvalidInput("error must be a non-empty string describing the failure")
    return error.replace("\0", "\\0")


def check_owner(owner: str) -> str:
    """A lease owner such as host:pid: non-empty text that fits the owner column."""
    if not isinstance(owner, str) or not owner.strip() or "\0" in owner or len(owner) > MAX_OWNER:
        raise InvalidInput(
            f"owner must be a non-empty string such as host:pid, at most {MAX_OWNER} characters "
            f"and without NUL, got {owner!r}"
        )
    return owner


def _p(column: sa.Column[Any], name: str | None = None) -> sa.BindParameter[Any]:
    return sa.bindparam(name or column.key, type_=column.type)


def _run(row: dict[str, Any]) -> Run:
    # Rows come from our own table through typed result processing: no re-validation needed.
    return Run.model_construct(**row)


def _holder() -> sa.ColumnElement[bool]:
    """The guard of every worker write: the Run is running under this exact fence and owner."""
    return sa.and_(
        runs.c.run_id == _p(runs.c.run_id),
        runs.c.fence == _p(runs.c.fence),
        runs.c.owner == _p(runs.c.owner),
        runs.c.status == "running",
    )


def _lease_until() -> sa.ColumnElement[Any]:
    return db_now(sa.bindparam("lease", type_=sa.Float()))


def _holder_params(claim: Claim) -> dict[str, Any]:
    return {"run_id": claim.run_id, "fence": claim.fence, "owner": claim.owner}


def _lease_lost(claim: Claim, run: Run | None = None) -> LeaseLost:
    now = f" (now fence {run.fence}, owner {run.owner}, status {run.status})" if run else ""
    return LeaseLost(
        f"run {claim.run_id}: fence {claim.fence} of {claim.owner} is no longer current{now}"
    )


# --- statements -----------------------------------------------------------------------------

_GET = Prepared(lambda d: sa.select(runs).where(runs.c.run_id == _p(runs.c.run_id)))

_REGISTER = Prepared(
    lambda d: insert_ignoring_conflicts(d, runs)
    .values(
        run_id=_p(runs.c.run_id), job=_p(runs.c.job), subject=_p(runs.c.subject),
        period_start=_p(runs.c.period_start), version=_p(runs.c.version),
        params_fingerprint=_p(runs.c.params_fingerprint), params=_p(runs.c.params),
        status="pending", fence=0, attempts=0, created_at=db_now(), updated_at=db_now(),
    )
    .returning(*runs.c)
)


def _take() -> sa.Update:
    return (
        sa.update(runs)
        .where(
            runs.c.run_id == _p(runs.c.run_id),
            sa.or_(runs.c.status == "pending", runs.c.status == "running"),
            sa.or_(
                runs.c.lease_expires_at.is_(None),
                runs.c.lease_expires_at <= db_now(),
                runs.c.owner == _p(runs.c.owner),
            ),
        )
        .values(
            fence=runs.c.fence + 1, owner=_p(runs.c.owner), status="running",
            attempts=runs.c.attempts + 1, lease_expires_at=_lease_until(), updated_at=db_now(),
        )
        .returning(runs.c.run_id, runs.c.fence, runs.c.lease_expires_at)
    )


def _close_attempts(run_id: sa.ColumnElement[Any]) -> sa.Update:
    """A new claim ends the previous holder's open Attempt: its lease expired or was re-taken."""
    return (
        sa.update(attempts)
        .where(attempts.c.run_id == run_id, attempts.c.finished_at.is_(None))
        .values(outcome="expired", finished_at=db_now())
    )


def _open_attempt_values() -> dict[str, Any]:
    return {"attempt_id": _p(attempts.c.attempt_id), "owner": _p(runs.c.owner),
            "started_at": db_now()}


def _claim_in_one_statement(_: str) -> sa.Select[Any]:
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


_CLAIM_PG = Prepared(_claim_in_one_statement)
_TAKE = Prepared(lambda d: _take())
_CLOSE_ATTEMPTS = Prepared(lambda d: _close_attempts(_p(runs.c.run_id)))
_OPEN_ATTEMPT = Prepared(
    lambda d: sa.insert(attempts).values(
        run_id=_p(runs.c.run_id), fence=_p(runs.c.fence), **_open_attempt_values()
    )
)


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
        _p(runs.c.owner), sa.literal(1), _lease_until(), now, now,
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


def _enter_in_one_statement(d: str, one: bool) -> sa.Select[Any]:
    given = _entries(d, one)
    taken = _enter(d, given).cte("taken")
    return sa.select(taken).add_cte(
        _close_attempts(taken.c.run_id).cte("closed"),
        postgresql.insert(attempts).from_select(
            ["attempt_id", "run_id", "owner", "fence", "started_at"],
            sa.select(given.c.attempt_id, taken.c.run_id, taken.c.owner, taken.c.fence, db_now())
            .join_from(taken, given, given.c.run_id == taken.c.run_id),
        ).cte("opened"),
    )


_ENTER_ONE_PG = Prepared(lambda d: _enter_in_one_statement(d, one=True))
_ENTER_MANY_PG = Prepared(lambda d: _enter_in_one_statement(d, one=False))
_ENTER = Prepared(lambda d: _enter(d, _entries(d, one=False)))

_RENEW_MANY = Prepared(
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

_RENEW = Prepared(
    lambda d: sa.update(runs).where(_holder())
    .values(lease_expires_at=_lease_until(), updated_at=db_now())
    .returning(runs.c.lease_expires_at)
)

_SAVE_INPUT = Prepared(
    lambda d: sa.update(runs).where(_holder())
    .values(raw_input=sa.func.coalesce(runs.c.raw_input, _p(runs.c.raw_input)), updated_at=db_now())
    .returning(runs.c.raw_input)
)


def _accept() -> sa.Update:
    return (
        sa.update(runs).where(_holder())
        .values(
            status="completed", output=_p(runs.c.output), owner=sa.null(),
            lease_expires_at=sa.null(), error=sa.null(), completed_at=db_now(), updated_at=db_now(),
            completed_attempt_id=_p(attempts.c.attempt_id),
        )
        .returning(*runs.c)
    )


def _finish_attempt() -> sa.Update:
    return (
        sa.update(attempts).where(attempts.c.attempt_id == _p(attempts.c.attempt_id))
        .values(outcome=sa.bindparam("outcome", type_=attempts.c.outcome.type),
                error=_p(attempts.c.error), finished_at=db_now())
    )


_GIVEN = ("message_id", "run_id", "channel", "recipient", "subject", "body", "headers")


def _queue(d: str, only_if: sa.ColumnElement[bool] | None = None) -> sa.Insert:
    """The Run's outbox rows, from one JSON array parameter; a row already queued is a no-op."""
    given = json_rows(d, "messages", [outbox.c[n] for n in _GIVEN]).subquery("given")
    now = db_now()
    # Always a WHERE: SQLite cannot otherwise tell ON CONFLICT from a join's ON.
    rows = sa.select(
        *[given.c[n] for n in _GIVEN], sa.literal("pending"), sa.literal(0), sa.literal(0),
        now, now, now,
    ).where(sa.true() if only_if is None else only_if)
    return insert_ignoring_conflicts(d, outbox).from_select(
        [*_GIVEN, "status", "attempts", "fence", "next_attempt_at", "created_at", "updated_at"],
        rows,
    )


def _complete_in_one_statement(d: str) -> sa.Select[Any]:
    accepted = _accept().cte("accepted")
    if_accepted = sa.exists(sa.select(accepted.c.run_id))
    return sa.select(accepted).add_cte(
        _finish_attempt().where(if_accepted).cte("finished"), _queue(d, if_accepted).cte("queued")
    )


_COMPLETE_PG = Prepared(_complete_in_one_statement)
_ACCEPT = Prepared(lambda d: _accept())
_QUEUE = Prepared(_queue)
_FINISH_ATTEMPT = Prepared(lambda d: _finish_attempt())

_RELEASE_OR_FAIL = Prepared(
    lambda d: sa.update(runs).where(_holder())
    .values(status=_p(runs.c.status), owner=sa.null(), lease_expires_at=sa.null(),
            error=_p(runs.c.error), updated_at=db_now())
    .returning(*runs.c)
)

_REQUEUE = Prepared(
    lambda d: sa.update(runs)
    .where(runs.c.run_id == _p(runs.c.run_id), runs.c.status == "failed")
    .values(status="pending", updated_at=db_now())
    .returning(*runs.c)
)


# --- reads ----------------------------------------------------------------------------------


def get_run(conn: Connection, run_id: str) -> Run | None:
    row = _GET.first(conn, run_id=run_id)
    return _run(row) if row else None


def _require(conn: Connection, run_id: str) -> Run:
    run = get_run(conn, run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return run


ID_CHARS = 64  # a Run or message id: sha256 as lowercase hex
MIN_ID_PREFIX = 4
SHOWN_CANDIDATES = 5
_HEX = frozenset("0123456789abcdef")


def resolve_id(conn: Connection, column: sa.ColumnElement[Any], text: str, what: str,
               missing: type[RunledgerError]) -> str:
    """The one id in ``column`` starting with ``text`` (the id, or at least its first
    MIN_ID_PREFIX hex characters, as git takes a commit's); ``missing`` when none does,
    ``AmbiguousId`` naming the candidates when several do."""
    prefix = text.strip().lower()
    if not prefix or len(prefix) > ID_CHARS or not set(prefix) <= _HEX:
        raise InvalidInput(f"{what} id {text!r} is not an id: give the id or its first "
                           f"characters (0-9, a-f, at most {ID_CHARS})")
    if len(prefix) < MIN_ID_PREFIX:
        raise InvalidInput(f"{what} id {text!r} is too short: give at least {MIN_ID_PREFIX} of "
                           "its characters")
    # Every id has 64 hex characters, so those starting with the prefix are exactly the range
    # from it padded with 0s to it padded with fs: the primary key's index serves that range
    # under any collation, where LIKE 'abc%' needs the C collation on PostgreSQL.
    low, high = prefix.ljust(ID_CHARS, "0"), prefix.ljust(ID_CHARS, "f")
    rows = conn.execute(
        sa.select(column, sa.func.count().over().label("matches"))
        .where(column.between(low, high)).order_by(column).limit(SHOWN_CANDIDATES)
    ).all()
    if not rows:
        which = "id" if len(prefix) == ID_CHARS else "an id starting"
        raise missing(f"no {what} with {which} {prefix!r}")
    if rows[0].matches > 1:
        shown = ", ".join(row[0][: max(16, len(prefix) + 4)] for row in rows)
        more = ", ..." if rows[0].matches > len(rows) else ""
        raise AmbiguousId(f"{what} id {prefix!r} is ambiguous: {rows[0].matches} {what}s start "
                          f"with it ({shown}{more}); give more of its characters")
    return str(rows[0][0])


def _rows_of(conn: Connection, columns: Sequence[Any], run_ids: Sequence[str],
             *conditions: sa.ColumnElement[bool]) -> Iterator[sa.Row[Any]]:
    """Rows of many Runs, one query per 500 ids (drivers limit a statement's parameters)."""
    for start in range(0, len(run_ids), 500):
        chunk = list(run_ids[start : start + 500])
        yield from conn.execute(
            sa.select(*columns).where(runs.c.run_id.in_(chunk), *conditions))


def get_runs(conn: Connection, run_ids: Sequence[str]) -> dict[str, Run]:
    """Many Runs at once."""
    return {row.run_id: _run(dict(row._mapping)) for row in _rows_of(conn, [runs], run_ids)}


_FINISHED = [runs.c[f.name] for f in fields(FinishedRun)]


def get_finished_runs(conn: Connection, run_ids: Sequence[str]) -> dict[str, FinishedRun]:
    """The completed and failed Runs among ``run_ids`` (a rerun of a whole tick reads them all
    at once)."""
    rows = _rows_of(conn, _FINISHED, run_ids, runs.c.status.in_(("completed", "failed")))
    return {row.run_id: FinishedRun(**row._mapping) for row in rows}


def list_runs(
    conn: Connection, *, job: str | None = None, status: str | None = None, limit: int = 100
) -> list[Run]:
    query = sa.select(runs).order_by(runs.c.period_start.desc(), runs.c.subject).limit(limit)
    if job is not None:
        query = query.where(runs.c.job == job)
    if status is not None:
        query = query.where(runs.c.status == status)
    return [_run(dict(row._mapping)) for row in conn.execute(query)]


def list_attempts(conn: Connection, run_id: str) -> list[Attempt]:
    query = sa.select(attempts).where(attempts.c.run_id == run_id).order_by(attempts.c.fence)
    return [Attempt.model_construct(**row._mapping) for row in conn.execute(query)]


# --- transitions ----------------------------------------------------------------------------


def register_txn(conn: Connection, identity: RunIdentity, params: dict[str, Any] | None) -> Run:
    """Insert the Run as pending or return the existing row; a different fingerprint is a conflict."""
    fingerprint = params_fingerprint(params)
    inserted = _REGISTER.first(
        conn, run_id=identity.run_id, job=identity.job, subject=identity.subject,
        period_start=identity.period_start, version=identity.version,
        params_fingerprint=fingerprint, params=params or {},
    )
    if inserted is not None:
        return _run(inserted)
    existing = _require(conn, identity.run_id)
    if existing.params_fingerprint != fingerprint:
        raise _conflict(identity, existing, fingerprint)
    return existing


def claim_txn(conn: Connection, run_id: str, owner: str, lease_seconds: float) -> Claim | None:
    """Take the lease if the Run is not finished and its lease is free, expired (database
    clock) or ours; bump the fence, count the attempt and open an Attempt row."""
    check_owner(owner)
    attempt_id = str(uuid.uuid4())
    lease = check_seconds(lease_seconds, "lease")
    given = {"run_id": run_id, "owner": owner, "lease": lease, "attempt_id": attempt_id}
    if is_postgres(conn):
        row = _CLAIM_PG.first(conn, **given)
    else:
        row = _TAKE.first(conn, **given)
        if row is not None:
            _CLOSE_ATTEMPTS.rows(conn, run_id=run_id)
            _OPEN_ATTEMPT.rows(conn, **given, fence=row["fence"])
    if row is None:
        _require(conn, run_id)
        return None
    return Claim(run_id, owner, row["fence"], attempt_id, row["lease_expires_at"])


def _conflict(identity: RunIdentity, existing: Run, fingerprint: str) -> RunConflict:
    return RunConflict(
        f"run {identity.run_id} ({identity.job}/{identity.subject}/"
        f"{identity.period_start.isoformat()}/{identity.version}) already exists with different "
        f"parameters (fingerprint {existing.params_fingerprint[:12]}, now {fingerprint[:12]}); "
        "bump the job version or request a revision to change them"
    )


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
    if is_postgres(conn) and len(given) == 1:
        taken = _ENTER_ONE_PG.rows(conn, runs=given[0], owner=owner, lease=lease)
    elif is_postgres(conn):
        taken = _ENTER_MANY_PG.rows(conn, runs=given, owner=owner, lease=lease)
    else:
        taken = _ENTER.rows(conn, runs=given, owner=owner, lease=lease)
    if not is_postgres(conn):
        for row in taken:
            _CLOSE_ATTEMPTS.rows(conn, run_id=row["run_id"])
            _OPEN_ATTEMPT.rows(conn, run_id=row["run_id"], fence=row["fence"], owner=owner,
                               attempt_id=attempt_ids[row["run_id"]])
    found: dict[str, Registration] = {}
    for row in taken:
        run = _run(row)
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


def renew_txn(conn: Connection, claim: Claim, lease_seconds: float) -> datetime:
    """Extend the lease from the database clock; only the current fence holder can."""
    row = _RENEW.first(conn, **_holder_params(claim), lease=check_seconds(lease_seconds, "lease"))
    if row is None:
        raise _lease_lost(claim, get_run(conn, claim.run_id))
    return row["lease_expires_at"]  # type: ignore[no-any-return]


def renew_many_txn(conn: Connection, claims: Sequence[Claim], lease_seconds: float) -> dict[str, datetime]:
    """Extend every still-held lease from the database clock in one statement; a claim whose
    fence moved on is left out of the result (its lease is lost)."""
    lease = check_seconds(lease_seconds, "lease")
    if not claims:
        return {}
    given = [{"run_id": c.run_id, "fence": c.fence, "owner": c.owner} for c in claims]
    rows = _RENEW_MANY.rows(conn, claims=given, lease=lease)
    return {row["run_id"]: row["lease_expires_at"] for row in rows}


def save_input_txn(conn: Connection, claim: Claim, raw: dict[str, Any]) -> dict[str, Any]:
    """Store the raw input once (first writer wins) and return the stored value; fence holder only."""
    row = _SAVE_INPUT.first(conn, **_holder_params(claim), raw_input=raw)
    if row is None:
        raise _lease_lost(claim, get_run(conn, claim.run_id))
    return row["raw_input"]  # type: ignore[no-any-return]


def _outbox_rows(run_id: str, messages: Iterable[OutboxMessage]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for message in messages:
        if not isinstance(message, OutboxMessage):
            raise InvalidInput(f"messages must be OutboxMessage objects, got {type(message).__name__}")
        key = message_key(run_id, message.channel, message.recipient)
        rows.setdefault(key, {
            "message_id": key, "run_id": run_id, "channel": message.channel,
            "recipient": message.recipient, "subject": message.subject, "body": message.body,
            "headers": dict(message.headers),
        })
    return list(rows.values())


def complete_txn(
    conn: Connection,
    claim: Claim,
    output: dict[str, Any],
    messages: Sequence[OutboxMessage] = (),
    effect: Effect | None = None,
) -> Completion:
    """Accept the output, clear the lease, queue the outbox rows and apply the effect together;
    only the fence holder can; a Run completed by someone else is returned unchanged."""
    rows = _outbox_rows(claim.run_id, messages)
    given = {**_holder_params(claim), "output": output, "attempt_id": claim.attempt_id,
             "outcome": "completed", "error": None}
    if is_postgres(conn):
        row = _COMPLETE_PG.first(conn, **given, messages=rows)
    else:
        row = _ACCEPT.first(conn, **given)
        if row is not None:
            _QUEUE.rows(conn, messages=rows)
            _FINISH_ATTEMPT.rows(conn, **given)
    if row is None:
        run = _require(conn, claim.run_id)
        if run.status != "completed":
            raise _lease_lost(claim, run)
        return Completion(run, new=False)
    if effect is not None:
        with Session(bind=conn) as session:
            effect(session)
            session.flush()
    return Completion(_run(row), new=True)


def fail_txn(conn: Connection, claim: Claim, error: str, retryable: bool) -> Run:
    """Record the error; a retryable failure releases the lease (pending), a permanent one marks
    the Run failed; only the fence holder can do either."""
    row = _RELEASE_OR_FAIL.first(
        conn, **_holder_params(claim), status="pending" if retryable else "failed", error=error
    )
    if row is None:
        raise _lease_lost(claim, get_run(conn, claim.run_id))
    _FINISH_ATTEMPT.rows(
        conn, attempt_id=claim.attempt_id, outcome="released" if retryable else "failed",
        error=error,
    )
    return _run(row)


def requeue_run_txn(conn: Connection, run_id: str) -> Run:
    """Operator action: a failed Run goes back to pending; no other state can be requeued."""
    row = _REQUEUE.first(conn, run_id=run_id)
    if row is None:
        run = _require(conn, run_id)
        raise InvalidTransition(f"run {run_id} is {run.status}; only a failed run can be requeued")
    return _run(row)
