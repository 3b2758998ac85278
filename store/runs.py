"""Run transitions. Each ``*_txn`` function is one state transition: it takes an open
connection, never commits (the caller owns the transaction) and states its rule in one line."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Row
from sqlmodel import Session

from store.dialect import db_now, insert_ignoring_conflicts, is_postgres, seconds
from store.errors import (
    InvalidInput,
    InvalidTransition,
    LeaseLost,
    OutputTooLarge,
    RunConflict,
    RunNotFound,
)
from store.identity import RunIdentity, canonical_json, message_key, params_fingerprint
from store.message import OutboxMessage
from store.models import (
    Attempt,
    JSONDoc,
    Run,
    attempts_table,
    outbox_table,
    runs_table,
)

runs = runs_table
attempts = attempts_table
outbox = outbox_table

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


def _run(row: Row[Any]) -> Run:
    return Run.model_validate(dict(row._mapping))


def _holder(claim: Claim) -> sa.ColumnElement[bool]:
    return sa.and_(
        runs.c.run_id == claim.run_id,
        runs.c.fence == claim.fence,
        runs.c.owner == claim.owner,
        runs.c.status == "running",
    )


def get_run(conn: Connection, run_id: str) -> Run | None:
    row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).first()
    return _run(row) if row else None


def get_runs(conn: Connection, run_ids: Sequence[str]) -> dict[str, Run]:
    """Many Runs in one query (a rerun of a whole tick reads them all at once)."""
    found: dict[str, Run] = {}
    for start in range(0, len(run_ids), 500):
        chunk = list(run_ids[start : start + 500])
        for row in conn.execute(sa.select(runs).where(runs.c.run_id.in_(chunk))):
            found[row.run_id] = _run(row)
    return found


def list_runs(
    conn: Connection, *, job: str | None = None, status: str | None = None, limit: int = 100
) -> list[Run]:
    query = sa.select(runs).order_by(runs.c.period_start.desc(), runs.c.subject).limit(limit)
    if job is not None:
        query = query.where(runs.c.job == job)
    if status is not None:
        query = query.where(runs.c.status == status)
    return [_run(row) for row in conn.execute(query)]


def list_attempts(conn: Connection, run_id: str) -> list[Attempt]:
    query = sa.select(attempts).where(attempts.c.run_id == run_id).order_by(attempts.c.fence)
    return [Attempt.model_validate(dict(row._mapping)) for row in conn.execute(query)]


def register_txn(conn: Connection, identity: RunIdentity, params: dict[str, Any] | None) -> Run:
    """Insert the Run as pending or return the existing row; a different fingerprint is a conflict."""
    fingerprint = params_fingerprint(params)
    now = db_now()
    inserted = conn.execute(
        insert_ignoring_conflicts(conn, runs)
        .values(
            run_id=identity.run_id, job=identity.job, subject=identity.subject,
            period_start=identity.period_start, version=identity.version,
            params_fingerprint=fingerprint, params=params or {}, status="pending",
            fence=0, attempts=0, created_at=now, updated_at=now,
        )
        .returning(*runs.c)
    ).first()
    if inserted is not None:
        return _run(inserted)
    existing = get_run(conn, identity.run_id)
    if existing is None:  # pragma: no cover - rows are never deleted
        raise RunNotFound(f"run {identity.run_id} vanished during register")
    if existing.params_fingerprint != fingerprint:
        raise RunConflict(
            f"run {identity.run_id} ({identity.job}/{identity.subject}/"
            f"{identity.period_start.isoformat()}/{identity.version}) already exists with different "
            f"parameters (fingerprint {existing.params_fingerprint[:12]}, now {fingerprint[:12]}); "
            "bump the job version or request a revision to change them"
        )
    return existing


def claim_txn(conn: Connection, run_id: str, owner: str, lease_seconds: float) -> Claim | None:
    """Take the lease if the Run is not finished and its lease is free, expired (database
    clock) or ours; bump the fence, count the attempt and open an Attempt row."""
    if not owner or not owner.strip():
        raise InvalidInput("owner must be a non-empty string such as host:pid")
    now = db_now()
    attempt_id = str(uuid.uuid4())
    take = (
        sa.update(runs)
        .where(
            runs.c.run_id == run_id,
            runs.c.status.in_(("pending", "running")),
            sa.or_(
                runs.c.lease_expires_at.is_(None),
                runs.c.lease_expires_at <= now,
                runs.c.owner == owner,
            ),
        )
        .values(
            fence=runs.c.fence + 1, owner=owner, status="running", attempts=runs.c.attempts + 1,
            lease_expires_at=db_now(seconds(lease_seconds, "lease")), updated_at=now,
        )
        .returning(runs.c.run_id, runs.c.fence, runs.c.lease_expires_at)
    )
    if is_postgres(conn):
        # One round trip: take the lease, close the previous attempt, open this one.
        taken = take.cte("taken")
        closed = (
            sa.update(attempts)
            .where(attempts.c.run_id == taken.c.run_id, attempts.c.finished_at.is_(None))
            .values(outcome="expired", finished_at=now)
            .cte("closed")
        )
        opened = postgresql.insert(attempts).from_select(
            ["attempt_id", "run_id", "owner", "fence", "started_at"],
            sa.select(sa.literal(attempt_id), taken.c.run_id, sa.literal(owner), taken.c.fence, now),
        ).cte("opened")
        row = conn.execute(sa.select(taken).add_cte(closed, opened)).first()
    else:
        row = conn.execute(take).first()
        if row is not None:
            conn.execute(
                sa.update(attempts)
                .where(attempts.c.run_id == run_id, attempts.c.finished_at.is_(None))
                .values(outcome="expired", finished_at=now)
            )
            conn.execute(
                sa.insert(attempts).values(
                    attempt_id=attempt_id, run_id=run_id, owner=owner, fence=row.fence,
                    started_at=now,
                )
            )
    if row is None:
        if get_run(conn, run_id) is None:
            raise RunNotFound(f"no run with id {run_id!r}")
        return None
    return Claim(run_id, owner, row.fence, attempt_id, row.lease_expires_at)


def renew_txn(conn: Connection, claim: Claim, lease_seconds: float) -> datetime:
    """Extend the lease from the database clock; only the current fence holder can."""
    expires = conn.execute(
        sa.update(runs)
        .where(_holder(claim))
        .values(lease_expires_at=db_now(seconds(lease_seconds, "lease")), updated_at=db_now())
        .returning(runs.c.lease_expires_at)
    ).scalar()
    if expires is None:
        raise LeaseLost(f"run {claim.run_id}: fence {claim.fence} of {claim.owner} is no longer current")
    return expires  # type: ignore[no-any-return]


def save_input_txn(conn: Connection, claim: Claim, raw: dict[str, Any]) -> dict[str, Any]:
    """Store the raw input once (first writer wins) and return the stored value; fence holder only."""
    stored = conn.execute(
        sa.update(runs)
        .where(_holder(claim))
        .values(
            raw_input=sa.func.coalesce(runs.c.raw_input, sa.literal(raw, JSONDoc)),
            updated_at=db_now(),
        )
        .returning(runs.c.raw_input)
    ).first()
    if stored is None:
        raise LeaseLost(f"run {claim.run_id}: fence {claim.fence} of {claim.owner} is no longer current")
    return stored.raw_input  # type: ignore[no-any-return]


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


def _why_not_held(conn: Connection, claim: Claim) -> Run:
    """The completed Run if someone else completed it; otherwise the reason as an error."""
    run = get_run(conn, claim.run_id)
    if run is None:
        raise RunNotFound(f"no run with id {claim.run_id!r}")
    if run.status == "completed":
        return run
    raise LeaseLost(
        f"run {claim.run_id}: fence {claim.fence} of {claim.owner} is no longer current "
        f"(now fence {run.fence}, owner {run.owner}, status {run.status})"
    )


def complete_txn(
    conn: Connection,
    claim: Claim,
    output: dict[str, Any],
    messages: Sequence[OutboxMessage] = (),
    effect: Effect | None = None,
) -> Completion:
    """Accept the output, clear the lease, queue the outbox rows and apply the effect together;
    only the fence holder can; a Run completed by someone else is returned unchanged."""
    now = db_now()
    rows = _outbox_rows(claim.run_id, messages)
    accept = (
        sa.update(runs)
        .where(_holder(claim))
        .values(
            status="completed", output=output, owner=None, lease_expires_at=None, error=None,
            completed_at=now, updated_at=now, completed_attempt_id=claim.attempt_id,
        )
        .returning(*runs.c)
    )
    finish = (
        sa.update(attempts)
        .where(attempts.c.attempt_id == claim.attempt_id)
        .values(outcome="completed", finished_at=now)
    )
    queue_defaults = {"status": "pending", "attempts": 0, "fence": 0, "next_attempt_at": now,
                      "created_at": now, "updated_at": now}
    if is_postgres(conn) and effect is None:
        # One round trip: accept, queue and close the attempt only if the accept matched.
        accepted = accept.cte("accepted")
        ctes = [finish.where(sa.exists(sa.select(accepted.c.run_id))).cte("finished")]
        if rows:
            names = list(rows[0].keys())
            given = sa.values(
                *[sa.column(n, outbox.c[n].type) for n in names], name="given"
            ).data([tuple(r[n] for n in names) for r in rows])
            queued = postgresql.insert(outbox).from_select(
                names + list(queue_defaults),
                sa.select(
                    *given.c,
                    *[
                        v if isinstance(v, sa.ColumnElement) else sa.literal(v, outbox.c[k].type)
                        for k, v in queue_defaults.items()
                    ],
                ).where(
                    sa.exists(sa.select(accepted.c.run_id))
                ),
            ).on_conflict_do_nothing(constraint="uq_outbox_run_channel_recipient")
            ctes.append(queued.cte("queued"))
        row = conn.execute(sa.select(accepted).add_cte(*ctes)).first()
    else:
        row = conn.execute(accept).first()
        if row is not None:
            if effect is not None:
                with Session(bind=conn) as session:
                    effect(session)
                    session.flush()
            if rows:
                conn.execute(
                    insert_ignoring_conflicts(conn, outbox).values(
                        [{**r, **queue_defaults} for r in rows]
                    )
                )
            conn.execute(finish)
    if row is None:
        return Completion(_why_not_held(conn, claim), new=False)
    return Completion(_run(row), new=True)


def fail_txn(conn: Connection, claim: Claim, error: str, retryable: bool) -> Run:
    """Record the error; a retryable failure releases the lease (pending), a permanent one marks
    the Run failed; only the fence holder can do either."""
    now = db_now()
    row = conn.execute(
        sa.update(runs)
        .where(_holder(claim))
        .values(
            status="pending" if retryable else "failed", owner=None, lease_expires_at=None,
            error=error, updated_at=now,
        )
        .returning(*runs.c)
    ).first()
    if row is None:
        run = _why_not_held(conn, claim)
        raise LeaseLost(f"run {claim.run_id} was completed by another attempt (fence {run.fence})")
    conn.execute(
        sa.update(attempts)
        .where(attempts.c.attempt_id == claim.attempt_id)
        .values(outcome="released" if retryable else "failed", error=error, finished_at=now)
    )
    return _run(row)


def requeue_run_txn(conn: Connection, run_id: str) -> Run:
    """Operator action: a failed Run goes back to pending; no other state can be requeued."""
    row = conn.execute(
        sa.update(runs)
        .where(runs.c.run_id == run_id, runs.c.status == "failed")
        .values(status="pending", updated_at=db_now())
        .returning(*runs.c)
    ).first()
    if row is None:
        run = get_run(conn, run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id!r}")
        raise InvalidTransition(f"run {run_id} is {run.status}; only a failed run can be requeued")
    return _run(row)
