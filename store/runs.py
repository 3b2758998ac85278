"""Run transitions of a held Run and an operator's: renew, save input, complete, fail,
requeue, take over. Each ``*_txn`` function is one state transition: it takes an open
connection, never commits (the caller owns the transaction), states its rule in one line and
declares where it is one statement (``@transition``). Registering and claiming a Run is
``store.registration``; reading Runs and Attempts, ``store.run_reads``.

Every transition is one guarded named statement (``store.statement``); on PostgreSQL the
follow-up writes of a transition (the Attempt row, the outbox rows) ride in the same statement
as data-modifying CTEs, so a transition is one round trip (``one_statement_writes``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlmodel import Session

from store.completion import UNRECORDED, CompletedBy, Completion, Effect
from store.dialect import db_now, json_rows, one_statement_writes
from store.errors import InvalidInput, InvalidTransition, LeaseLost
from store.fence import RUN_LEASE
from store.lease import Claim, lease_until
from store.message import OutboxMessage
from store.models import Run, attempts_table, runs_table
from store.outbox_queue import message_rows, queue, queue_messages
from store.run_reads import get_run, require_run, run_from_row
from store.statement import EVERYWHERE, NOWHERE, ON_POSTGRES, Statement, optional, param, transition
from store.validators import check_calls, check_seconds

runs = runs_table
attempts = attempts_table


def _presented(claim: Claim) -> dict[str, Any]:
    return RUN_LEASE.presented(claim.run_id, claim.fence, claim.owner)


def _stale_fence(claim: Claim, run: Run | None = None) -> LeaseLost:
    now = f" (now fence {run.fence}, owner {run.owner}, status {run.status})" if run else ""
    return LeaseLost(
        f"run {claim.run_id}: fence {claim.fence} of {claim.owner} is no longer current{now}"
    )


# --- statements: one name and one rule each (store/sql/<dialect>.sql shows what they send) ---

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
    .values(lease_expires_at=lease_until(), updated_at=db_now())
    .returning(runs.c.run_id, runs.c.lease_expires_at)
)

_SAVE_INPUT = Statement(
    "save_input", "Store the raw input once (the first writer's value stays) and return the "
    "stored one; only the current fence holder can.",
    lambda d: sa.update(runs).where(RUN_LEASE.holder())
    .values(raw_input=sa.func.coalesce(runs.c.raw_input, param(runs.c.raw_input)), updated_at=db_now())
    .returning(runs.c.raw_input)
)


def _more_calls() -> sa.ColumnElement[Any]:
    """The Run's model calls plus those of the Attempt that ends now."""
    return runs.c.model_calls + param(runs.c.model_calls)


def _accept() -> sa.Update:
    return (
        sa.update(runs).where(RUN_LEASE.holder())
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
    lambda d: sa.update(runs).where(RUN_LEASE.holder())
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


# --- transitions ----------------------------------------------------------------------------


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
    row = _SAVE_INPUT.first(conn, **_presented(claim), raw_input=raw)
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
    given = {**_presented(claim), "output": output, "attempt_id": claim.attempt_id,
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
        conn, **_presented(claim), status="pending" if retryable else "failed", error=error,
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
