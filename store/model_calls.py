"""Model calls: every request to a model endpoint is recorded, fenced by its Attempt's lease,
before it leaves the process; its answer is checkpointed in the same commit that records it
answered, so that a later attempt of the Run replays it (``store.checkpoints``) instead of
paying for it again. A call in flight whose Attempt no longer holds a lease is lost, and still
counted: paid per Run <= calls of one transform + lost.

One transition per operation, each taking the steps the call carries (``store.call_plan``:
its budget reservation, its endpoint slot) in its own transaction: ``record_intent_txn``,
``record_end_txn`` (answered, refused or failed), ``mark_lost_txn``. Each takes an open
connection and never commits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.call_plan import (
    End,
    InFlight,
    Intent,
    charge_lost,
    end_is_one_statement,
    intent_is_one_statement,
)
from store.call_tables import ModelCall, model_calls_table
from store.dialect import db_now, json_rows
from store.endpoint_limits import SlotDecision
from store.errors import LeaseLost, RunledgerError
from store.fence import RUN_LEASE, run_held
from store.lease import Claim
from store.models import runs_table
from store.statement import EVERYWHERE, NOWHERE, Statement, insert_rows, param, transition
from store.validators import error_text

calls = model_calls_table
runs = runs_table


class AlreadyAnswered(RunledgerError):
    """A batch answered this call (position, prompt) of the Run after the Attempt looked for
    an answer to replay; nothing was written: replay it."""

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        super().__init__(f"model call {call_id} was answered by its batch; nothing was "
                         "written: replay its answer")


class AlreadyQueued(RunledgerError):
    """The Run has queued this call (position, prompt) for a batch already; nothing was
    written: wait for its batch."""

    def __init__(self, call_id: str) -> None:
        super().__init__(f"model call {call_id} is queued for a batch already; nothing was "
                         "written: wait for its batch")
        self.call_id = call_id


def _intent(d: str, queued: bool = False) -> Any:
    names = ["call_id", "run_id", "attempt_id", "fence", "job", "endpoint", "model", "position",
             "prompt_digest", "started_at", "estimate", "budget_period", "budget_day"]
    values: list[Any] = [
        param(calls.c.call_id), param(runs.c.run_id), param(calls.c.attempt_id),
        param(runs.c.fence), runs.c.job, param(calls.c.endpoint), param(calls.c.model),
        param(calls.c.position), param(calls.c.prompt_digest), db_now(),
        param(calls.c.estimate), param(calls.c.budget_period), param(calls.c.budget_day)]
    if queued:
        names += ["outcome", "custom_id", "request", "flow_run_id", "queued_tokens"]
        values += [sa.literal("queued"), param(calls.c.custom_id), param(calls.c.request),
                   param(calls.c.flow_run_id), param(calls.c.queued_tokens)]
    rows = sa.select(*values).where(RUN_LEASE.holder())
    return insert_rows(sa.insert(calls), names, rows).returning(calls.c.call_id)


_INTENT = Statement(
    "record_call_intent", "Record a model call before it leaves, in flight (no outcome), only "
    "while its Attempt holds the Run's lease (fence, owner, database clock).", _intent)

_QUEUE = Statement(
    "record_call_queued", "Record a model call queued for a provider's batch (its line's id "
    "and request body) instead of sent, only while its Attempt holds the Run's lease.",
    lambda d: _intent(d, queued=True))

_BATCHED_ALREADY = Statement(
    "find_batched_call", "The Run's call of this position and prompt that waits in a batch, or "
    "that a batch answered (its answer not rejected), if it queued one already (a Run queues a "
    "call once).",
    lambda d: sa.select(calls.c.call_id, calls.c.outcome)
    .where(calls.c.run_id == param(runs.c.run_id), calls.c.position == param(calls.c.position),
           calls.c.prompt_digest == param(calls.c.prompt_digest),
           sa.or_(calls.c.outcome == "queued",
                  sa.and_(calls.c.outcome == "answered", calls.c.batch_key.is_not(None),
                          calls.c.rejected_at.is_(None))))
    .order_by(calls.c.started_at, calls.c.call_id).limit(1))

_ANSWERED = sa.and_(calls.c.outcome.is_(None), run_held(calls.c.fence))


# The call named, still without an outcome, or marked lost before it told what became of it
# (a lost call's end is recorded once, when its own attempt hears of it).
_UNENDED = (calls.c.call_id == param(calls.c.call_id),
            sa.or_(calls.c.outcome.is_(None),
                   sa.and_(calls.c.outcome == "lost", calls.c.latency_ms.is_(None))))


def end_values() -> dict[str, Any]:
    """What a call's end records besides its outcome: its usage, cost and end time."""
    return {"prompt_tokens": param(calls.c.prompt_tokens),
            "completion_tokens": param(calls.c.completion_tokens),
            "cached_tokens": param(calls.c.cached_tokens),
            "cache_write_tokens": param(calls.c.cache_write_tokens),
            "sync_cost_nanos": param(calls.c.sync_cost_nanos),
            "latency_ms": param(calls.c.latency_ms), "cost_nanos": param(calls.c.cost_nanos),
            "currency": param(calls.c.currency), "overrun": param(calls.c.overrun),
            "finished_at": db_now()}


def _answer(d: str) -> Any:
    return (
        sa.update(calls)
        .where(*_UNENDED)
        .values(outcome=sa.case((_ANSWERED, "answered"), else_="lost"),
                answer=sa.case((_ANSWERED, param(calls.c.answer)), else_=sa.null()),
                **end_values())
        .returning(calls.c.outcome)
    )


_ANSWER = Statement(
    "record_call_answer", "Record a call answered with its usage and checkpoint its answer, "
    "only while its Attempt holds the Run's lease; otherwise the call is lost (another "
    "attempt may be paying for it again) and only its usage is recorded.", _answer)


def _end(d: str) -> Any:
    return (
        sa.update(calls)
        .where(*_UNENDED)
        .values(outcome=param(calls.c.outcome), error=param(calls.c.error), **end_values())
        .returning(calls.c.outcome)
    )


_END = Statement(
    "record_call_failure", "Record a call refused by the provider (an error reply: not billed) "
    "or failed (no usable answer: timeout, connection lost, malformed reply), with its error; "
    "a call already marked lost learns what became of it.", _end)


def _lost(d: str) -> Any:
    live = sa.exists(sa.select(runs.c.run_id).where(
        runs.c.run_id == calls.c.run_id, runs.c.fence == calls.c.fence,
        runs.c.status == "running"))
    return (
        sa.update(calls)
        .where(calls.c.run_id == param(runs.c.run_id), calls.c.outcome.is_(None), ~live)
        .values(outcome="lost", finished_at=db_now())
        .returning(calls.c.call_id, calls.c.job, calls.c.estimate, calls.c.budget_period,
                   calls.c.budget_day)
    )


_LOST = Statement(
    "mark_calls_lost", "A Run's calls in flight whose Attempt no longer holds a lease "
    "(its fence moved on: taken over after a crash or an expired lease; or the Run was finished or "
    "released without them) are lost: counted as paid.", _lost)


WITHOUT_DOCUMENTS = [c for c in calls.c if c.key not in ("answer", "request")]

_OF_RUN = Statement(
    "list_model_calls", "A Run's model calls, in the order they were made, without answers "
    "(nor queued requests).",
    lambda d: sa.select(*WITHOUT_DOCUMENTS)
    .where(calls.c.run_id == param(runs.c.run_id))
    .order_by(calls.c.started_at, calls.c.fence, calls.c.position))

_OF_RUNS = Statement(
    "list_model_calls_of_runs", "The model calls of the Runs whose ids are given, without "
    "answers (nor queued requests): one statement for a whole tick.",
    lambda d: sa.select(*WITHOUT_DOCUMENTS)
    .where(calls.c.run_id.in_(json_rows(d, "ids", [calls.c.run_id])))
    .order_by(calls.c.run_id, calls.c.started_at, calls.c.position))

_SINCE = Statement(
    "read_model_calls_since", "The model calls started from a moment on (optionally of one "
    "job), with their Run's revision: what stats and costs add up, no answers; not the calls "
    "still queued in a batch (neither in flight nor paid).",
    lambda d: sa.select(calls.c.run_id, calls.c.job, calls.c.model, calls.c.started_at,
                        calls.c.outcome, calls.c.prompt_tokens, calls.c.completion_tokens,
                        calls.c.cached_tokens, calls.c.cache_write_tokens, calls.c.cost_nanos, calls.c.currency, calls.c.reuses,
                        calls.c.rejected_at, calls.c.overrun, calls.c.batch_key,
                        calls.c.sync_cost_nanos, runs.c.revision)
    .join_from(calls, runs, runs.c.run_id == calls.c.run_id)
    .where(calls.c.started_at >= sa.bindparam("since", type_=calls.c.started_at.type),
           sa.or_(calls.c.outcome.is_(None), calls.c.outcome != "queued"),
           sa.or_(sa.cast(param(calls.c.job), calls.c.job.type).is_(None),
                  calls.c.job == sa.cast(param(calls.c.job), calls.c.job.type))))


def _presented(claim: Claim) -> dict[str, Any]:
    return RUN_LEASE.presented(claim.run_id, claim.fence, claim.owner)


@transition(one_statement_on=EVERYWHERE, when=intent_is_one_statement)
def record_intent_txn(conn: Connection, claim: Claim, intent: Intent) -> InFlight | SlotDecision:
    """Record the call in flight before it leaves, after the steps it carries (its endpoint
    slot taken, its budget estimate reserved), all or none; only the holder of the Run's lease
    can (``LeaseLost``: no call may leave for a Run this Attempt no longer holds;
    ``BudgetExhausted``: a window without room). When its endpoint allows no call now, the
    decision that says how long to wait (only the endpoint's buckets' refill is written). A
    call ``queued`` for a batch is recorded queued with its line (``AlreadyQueued``, nothing
    written, when the Run queued it already; ``AlreadyAnswered`` when a batch answered it
    since this Attempt looked for an answer to replay)."""
    if intent.queued is not None:
        found = _BATCHED_ALREADY.first(conn, run_id=claim.run_id, position=intent.position,
                                       prompt_digest=intent.prompt_digest)
        if found is not None and found["outcome"] == "queued":
            raise AlreadyQueued(found["call_id"])
        if found is not None:
            raise AlreadyAnswered(found["call_id"])
    for step in intent.steps:
        stopped = step.before_intent(conn)
        if stopped is not None:
            return stopped
    call_id = str(uuid.uuid4())
    given = {**_presented(claim), "call_id": call_id, "attempt_id": claim.attempt_id,
             "endpoint": intent.endpoint, "model": intent.model, "position": intent.position,
             "prompt_digest": intent.prompt_digest, **intent.budget_params()}
    if intent.queued is None:
        row = _INTENT.first(conn, **given)
    else:
        row = _QUEUE.first(conn, **given, custom_id=intent.queued.custom_id,
                           request=intent.queued.request,
                           flow_run_id=intent.queued.flow_run_id,
                           queued_tokens=intent.queued.tokens)
    if row is None:
        raise LeaseLost(f"run {claim.run_id}: fence {claim.fence} of {claim.owner} no longer "
                        "holds a lease; the model call was not made")
    return InFlight(call_id, claim, intent.charge, intent.slot)


@transition(one_statement_on=EVERYWHERE, when=end_is_one_statement)
def record_end_txn(conn: Connection, call: InFlight, end: End) -> str | None:
    """Record how the call ended, with its usage, then the steps it carries (its budget
    reservation settled to the real cost, or released): answered with its checkpoint while
    the Attempt holds the Run's lease, else lost (its usage recorded, its answer not);
    refused or failed with its error. The outcome recorded; None when the call had ended
    already (a late report changes nothing)."""
    if end.outcome == "answered":
        row = _ANSWER.first(conn, **_presented(call.claim), call_id=call.call_id,
                            answer=end.answer, **end.usage.params())
    else:
        row = _END.first(conn, call_id=call.call_id, outcome=end.outcome,
                         error=error_text(end.error or ""), **end.usage.params())
    if row is None:
        return None
    for step in call.steps:
        step.after_end(conn, end)
    return str(row["outcome"])


@transition(one_statement_on=NOWHERE)
def mark_lost_txn(conn: Connection, run_id: str) -> list[str]:
    """Mark lost the Run's calls in flight whose Attempt no longer holds a lease, each
    charged its estimate in its budget windows (a call that left may have been billed); the
    ids of the calls marked."""
    marked = _LOST.rows(conn, run_id=run_id)
    for row in marked:
        charge_lost(conn, row)
    return [row["call_id"] for row in marked]


def list_calls(conn: Connection, run_id: str) -> list[ModelCall]:
    """A Run's model calls in the order they were made (answers left out)."""
    return [ModelCall.model_construct(**row) for row in _OF_RUN.rows(conn, run_id=run_id)]


def list_calls_of(conn: Connection, run_ids: Sequence[str]) -> dict[str, list[ModelCall]]:
    """The model calls of each of ``run_ids`` (an empty list for a Run without any)."""
    found: dict[str, list[ModelCall]] = {run_id: [] for run_id in run_ids}
    if run_ids:
        rows = _OF_RUNS.rows(conn, ids=[{"run_id": run_id} for run_id in run_ids])
        for row in rows:
            found[row["run_id"]].append(ModelCall.model_construct(**row))
    return found


def read_calls_since(conn: Connection, since: datetime, job: str | None = None
                     ) -> list[dict[str, Any]]:
    """The model calls started from ``since`` on, as plain rows (see ``_SINCE``)."""
    return _SINCE.rows(conn, since=since, job=job)
