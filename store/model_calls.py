"""Model calls: every request to a model endpoint is recorded, fenced by its Attempt's lease,
before it leaves the process; its answer is checkpointed in the same commit that records it
answered, so that a later attempt of the Run replays it (by its position in the transform and
its prompt's digest) instead of paying for it again. A call in flight whose Attempt no longer
holds a lease is lost, and still counted: paid per Run <= calls of one transform + lost.

Each ``*_txn`` function is one transition: it takes an open connection and never commits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store import budgets, endpoint_limits
from store.dialect import db_now, json_rows, upsert
from store.errors import InvalidInput, LeaseLost
from store.lease import Claim
from store.models import ModelCall, model_calls_table, runs_table, suppressed_costs_table
from store.statement import EVERYWHERE, NOWHERE, Statement, param, transition
from store.validators import error_text

calls = model_calls_table
runs = runs_table
MAX_NAME = 300
DIGEST_CHARS = 64


def _check_count(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name} must be an integer of 0 or more (or None), got {value!r}")
    return value


def _check_name(value: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME:
        raise InvalidInput(f"{name} must be non-empty text of at most {MAX_NAME} characters, "
                           f"got {value!r}")
    return value


@dataclass(frozen=True)
class Intent:
    """A call about to leave: the endpoint and model it goes to, its position in the transform
    (0 for the first call) and its prompt's sha256; ``charge`` reserves its estimate against
    the job's budget windows first."""

    endpoint: str
    model: str
    position: int
    prompt_digest: str
    charge: budgets.Charge | None = None

    def __post_init__(self) -> None:
        _check_name(self.endpoint, "a model call's endpoint")
        _check_name(self.model, "a model call's model")
        if _check_count(self.position, "a model call's position") is None:
            raise InvalidInput("a model call's position is required")
        if not (isinstance(self.prompt_digest, str) and len(self.prompt_digest) == DIGEST_CHARS):
            raise InvalidInput("a model call's prompt digest is a sha256 hex digest")


@dataclass(frozen=True)
class Usage:
    """What the provider reported a call used, and what it cost: tokens (None when not
    reported), latency, the cost in billionths of ``currency`` (both None: no price), and the
    tokens billed beyond the call's bound (``overrun``: 0 or None when within it)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: int | None = None
    cost_nanos: int | None = None
    currency: str | None = None
    overrun: int | None = None

    def __post_init__(self) -> None:
        _check_count(self.prompt_tokens, "prompt_tokens")
        _check_count(self.completion_tokens, "completion_tokens")
        _check_count(self.latency_ms, "latency_ms")
        _check_count(self.cost_nanos, "cost_nanos")
        _check_count(self.overrun, "overrun")
        if (self.cost_nanos is None) != (self.currency is None):
            raise InvalidInput("a call's cost and its currency are given together, or neither")

    @property
    def tokens(self) -> int:
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    def params(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "latency_ms": self.latency_ms, "cost_nanos": self.cost_nanos,
                "currency": self.currency, "overrun": self.overrun}


NO_USAGE = Usage()  # a call that ended without a usage report


@dataclass(frozen=True)
class InFlight:
    """A recorded call, in flight: its id, the claim it was made under and its reservation."""

    call_id: str
    claim: Claim
    charge: budgets.Charge | None
    taken: endpoint_limits.Acquisition | None = None  # what it took of its endpoint's limits


@dataclass(frozen=True)
class Checkpoint:
    """An answer recorded for a position of a Run's transform, handed to a later attempt."""

    call_id: str
    answer: dict[str, Any]


def _holder(fence: Any = None) -> sa.ColumnElement[bool]:
    """The Run is running under this fence and owner: the guard of every worker write (as a
    completion's), so that a call's record and its checkpoint stand or fall with the claim."""
    return sa.exists(sa.select(runs.c.run_id).where(
        runs.c.run_id == param(runs.c.run_id),
        runs.c.fence == (param(runs.c.fence) if fence is None else fence),
        runs.c.owner == param(runs.c.owner),
        runs.c.status == "running",
    ))


def _holder_params(claim: Claim) -> dict[str, Any]:
    return {"run_id": claim.run_id, "fence": claim.fence, "owner": claim.owner}


def _intent(d: str) -> Any:
    rows = sa.select(
        param(calls.c.call_id), param(runs.c.run_id), param(calls.c.attempt_id),
        param(runs.c.fence), runs.c.job, param(calls.c.endpoint), param(calls.c.model),
        param(calls.c.position), param(calls.c.prompt_digest), db_now(),
        param(calls.c.estimate), param(calls.c.budget_period), param(calls.c.budget_day),
    ).where(
        runs.c.run_id == param(runs.c.run_id), runs.c.fence == param(runs.c.fence),
        runs.c.owner == param(runs.c.owner), runs.c.status == "running",
    )
    return sa.insert(calls).from_select(
        ["call_id", "run_id", "attempt_id", "fence", "job", "endpoint", "model", "position",
         "prompt_digest", "started_at", "estimate", "budget_period", "budget_day"], rows,
    ).returning(calls.c.call_id)


_INTENT = Statement(
    "record_call_intent", "Record a model call before it leaves, in flight (no outcome), only "
    "while its Attempt holds the Run's lease (fence, owner, database clock).", _intent)

_ANSWERED = sa.and_(calls.c.outcome.is_(None), _holder(calls.c.fence))


# The call named, still without an outcome, or marked lost before it told what became of it
# (a lost call's end is recorded once, when its own attempt hears of it).
_UNENDED = (calls.c.call_id == param(calls.c.call_id),
            sa.or_(calls.c.outcome.is_(None),
                   sa.and_(calls.c.outcome == "lost", calls.c.latency_ms.is_(None))))


def _usage() -> dict[str, Any]:
    """What a call's end records besides its outcome: its usage, cost and end time."""
    return {"prompt_tokens": param(calls.c.prompt_tokens),
            "completion_tokens": param(calls.c.completion_tokens),
            "latency_ms": param(calls.c.latency_ms), "cost_nanos": param(calls.c.cost_nanos),
            "currency": param(calls.c.currency), "overrun": param(calls.c.overrun),
            "finished_at": db_now()}


def _answer(d: str) -> Any:
    return (
        sa.update(calls)
        .where(*_UNENDED)
        .values(outcome=sa.case((_ANSWERED, "answered"), else_="lost"),
                answer=sa.case((_ANSWERED, param(calls.c.answer)), else_=sa.null()),
                **_usage())
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
        .values(outcome=param(calls.c.outcome), error=param(calls.c.error), **_usage())
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


def _replay(d: str) -> Any:
    latest = (
        sa.select(calls.c.call_id)
        .where(calls.c.run_id == param(runs.c.run_id), calls.c.position == param(calls.c.position),
               calls.c.prompt_digest == param(calls.c.prompt_digest),
               calls.c.outcome == "answered", calls.c.answer.is_not(None),
               calls.c.rejected_at.is_(None))
        .order_by(calls.c.started_at.desc(), calls.c.call_id)
        .limit(1).scalar_subquery()
    )
    return (
        sa.update(calls)
        .where(calls.c.call_id == latest, _holder())
        .values(reuses=calls.c.reuses + 1)
        .returning(calls.c.call_id, calls.c.answer)
    )


_REPLAY = Statement(
    "replay_call", "The checkpointed answer of a position of the Run's transform whose prompt "
    "has the same digest (not one validation rejected), counted as reused; only for the "
    "Attempt holding the Run's lease.", _replay)

_REJECT = Statement(
    "reject_answers", "Validation rejected the Run's candidate: its checkpointed answers are "
    "kept as evidence and never replayed; only the holder of the Run's lease can.",
    lambda d: sa.update(calls)
    .where(calls.c.run_id == param(runs.c.run_id), calls.c.outcome == "answered",
           calls.c.rejected_at.is_(None), _holder())
    .values(rejected_at=db_now())
    .returning(calls.c.call_id))

_OF_RUN = Statement(
    "list_model_calls", "A Run's model calls, in the order they were made, without answers.",
    lambda d: sa.select(*[c for c in calls.c if c.key != "answer"])
    .where(calls.c.run_id == param(runs.c.run_id))
    .order_by(calls.c.started_at, calls.c.fence, calls.c.position))

_OF_RUNS = Statement(
    "list_model_calls_of_runs", "The model calls of the Runs whose ids are given, without "
    "answers: one statement for a whole tick.",
    lambda d: sa.select(*[c for c in calls.c if c.key != "answer"])
    .where(calls.c.run_id.in_(json_rows(d, "ids", [calls.c.run_id])))
    .order_by(calls.c.run_id, calls.c.started_at, calls.c.position))

_SINCE = Statement(
    "read_model_calls_since", "The model calls started from a moment on (optionally of one "
    "job), with their Run's revision: what stats and costs add up, no answers.",
    lambda d: sa.select(calls.c.run_id, calls.c.job, calls.c.model, calls.c.started_at,
                        calls.c.outcome, calls.c.prompt_tokens, calls.c.completion_tokens,
                        calls.c.cost_nanos, calls.c.currency, calls.c.reuses,
                        calls.c.rejected_at, calls.c.overrun, runs.c.revision)
    .join_from(calls, runs, runs.c.run_id == calls.c.run_id)
    .where(calls.c.started_at >= sa.bindparam("since", type_=calls.c.started_at.type),
           sa.or_(sa.cast(param(calls.c.job), calls.c.job.type).is_(None),
                  calls.c.job == sa.cast(param(calls.c.job), calls.c.job.type))))


saved = suppressed_costs_table


def _count_saved(d: str) -> Any:
    ids = json_rows(d, "ids", [calls.c.run_id]).subquery("given")
    currency = sa.func.coalesce(calls.c.currency, sa.literal_column("''"))
    tokens = sa.func.coalesce(calls.c.prompt_tokens, 0) + sa.func.coalesce(calls.c.completion_tokens, 0)
    rows = (
        sa.select(param(saved.c.job), param(saved.c.day), currency,
                  sa.func.count(sa.distinct(calls.c.run_id)), sa.func.count(),
                  sa.func.coalesce(sa.func.sum(tokens), 0),
                  sa.func.coalesce(sa.func.sum(calls.c.cost_nanos), 0), db_now())
        .join_from(calls, ids, ids.c.run_id == calls.c.run_id)
        .where(calls.c.outcome == "answered")
        .group_by(currency)
    )
    insert = upsert(d, saved).from_select(
        ["job", "day", "currency", "runs", "calls", "tokens", "cost_nanos", "updated_at"], rows)
    proposed = insert.excluded
    return insert.on_conflict_do_update(
        index_elements=[saved.c.job, saved.c.day, saved.c.currency],
        set_={"runs": saved.c.runs + proposed.runs, "calls": saved.c.calls + proposed.calls,
              "tokens": saved.c.tokens + proposed.tokens,
              "cost_nanos": saved.c.cost_nanos + proposed.cost_nanos,
              "updated_at": proposed.updated_at})


_COUNT_SAVED = Statement(
    "count_saved", "Add what the duplicates one tick suppressed would have cost to the job's "
    "counts for the UTC day: each duplicate Run's answered calls' tokens and money, per "
    "currency (the answers a rerun would pay for again; a lost or failed call of an earlier "
    "attempt is not repeated by one).", _count_saved)

_SAVED_SINCE = Statement(
    "read_saved_since", "What suppressed duplicates would have cost, from a UTC day on "
    "(optionally of one job).",
    lambda d: sa.select(saved.c.job, saved.c.day, saved.c.currency, saved.c.runs, saved.c.calls,
                        saved.c.tokens, saved.c.cost_nanos)
    .where(saved.c.day >= param(saved.c.day),
           sa.or_(sa.cast(param(saved.c.job), saved.c.job.type).is_(None),
                  saved.c.job == sa.cast(param(saved.c.job), saved.c.job.type))))


def _settle(conn: Connection, charge: budgets.Charge | None, cost: int) -> None:
    if charge is not None:
        for window in charge.windows:
            budgets.settle(conn, charge.job, window.scope, window.start, charge.estimate, cost)


def _budget_params(charge: budgets.Charge | None) -> dict[str, Any]:
    if charge is None:
        return {"estimate": 0, "budget_period": None, "budget_day": None}
    period, day = charge.window("period"), charge.window("day")
    return {"estimate": charge.estimate, "budget_period": period.start if period else None,
            "budget_day": day.start.date() if day else None}


@transition(one_statement_on=EVERYWHERE)
def record_intent_txn(conn: Connection, claim: Claim, intent: Intent) -> InFlight:
    """Record the call in flight before it leaves; only the holder of the Run's lease can
    (``LeaseLost`` otherwise: no call may leave for a Run this Attempt no longer holds)."""
    if intent.charge is not None:
        raise InvalidInput("a call with a budget charge is recorded by reserve_and_record_intent_txn")
    return _record(conn, claim, intent)


def _record(conn: Connection, claim: Claim, intent: Intent) -> InFlight:
    call_id = str(uuid.uuid4())
    row = _INTENT.first(
        conn, **_holder_params(claim), call_id=call_id, attempt_id=claim.attempt_id,
        endpoint=intent.endpoint, model=intent.model, position=intent.position,
        prompt_digest=intent.prompt_digest, **_budget_params(intent.charge))
    if row is None:
        raise LeaseLost(f"run {claim.run_id}: fence {claim.fence} of {claim.owner} no longer "
                        "holds a lease; the model call was not made")
    return InFlight(call_id, claim, intent.charge)


@transition(one_statement_on=NOWHERE)
def reserve_and_record_intent_txn(conn: Connection, claim: Claim, intent: Intent) -> InFlight:
    """Reserve the call's estimate in its job's budget windows, then record it in flight, both
    or neither: ``BudgetExhausted`` (a window without room) or ``LeaseLost`` roll back both."""
    if intent.charge is None:
        raise InvalidInput("a call without a budget charge is recorded by record_intent_txn")
    budgets.reserve(conn, intent.charge)
    return _record(conn, claim, intent)


@transition(one_statement_on=NOWHERE)
def acquire_and_record_intent_txn(conn: Connection, claim: Claim, intent: Intent,
                                  taken: endpoint_limits.Acquisition
                                  ) -> InFlight | endpoint_limits.Throttle:
    """Take the call's slot of its endpoint's limits, then reserve its budget charge (if any)
    and record it in flight, all or none; when the limits allow no call now, the Throttle
    that says how long to wait (only the buckets' refill is written)."""
    if taken.endpoint != intent.endpoint:
        raise InvalidInput(f"a call to endpoint {intent.endpoint!r} takes a slot of that "
                           f"endpoint, not of {taken.endpoint!r}")
    throttle = endpoint_limits.acquire(conn, taken)
    if not throttle.granted:
        return throttle
    if intent.charge is not None:
        budgets.reserve(conn, intent.charge)
    flight = _record(conn, claim, intent)
    return InFlight(flight.call_id, claim, intent.charge, taken)


def _answer_document(answer: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise InvalidInput(f"a checkpointed answer is a JSON object, got {type(answer).__name__}")
    return answer


def _answered(conn: Connection, call: InFlight, answer: dict[str, Any], usage: Usage
              ) -> dict[str, Any] | None:
    return _ANSWER.first(conn, **_holder_params(call.claim), call_id=call.call_id,
                         answer=_answer_document(answer), **usage.params())


@transition(one_statement_on=EVERYWHERE)
def record_answer_txn(conn: Connection, call: InFlight, answer: dict[str, Any],
                      usage: Usage) -> bool:
    """Record the call answered with its usage and checkpoint the answer; True if
    checkpointed, False if the Attempt's lease had ended (the call is lost: its usage is
    recorded, its answer is not)."""
    if call.charge is not None:
        raise InvalidInput("a call with a budget charge is settled by record_answer_and_settle_txn")
    row = _answered(conn, call, answer, usage)
    return row is not None and row["outcome"] == "answered"


@transition(one_statement_on=NOWHERE)
def record_answer_and_settle_txn(conn: Connection, call: InFlight, answer: dict[str, Any],
                                 usage: Usage) -> bool:
    """As ``record_answer_txn``, and settle the call's budget reservation to its real cost
    (money, or tokens) in the same commit; an answer without a usage report (or a price) is
    charged its reservation, the most it could cost."""
    if call.charge is None:
        raise InvalidInput("a call without a budget charge is recorded by record_answer_txn")
    row = _answered(conn, call, answer, usage)
    if row is None:
        return False  # a late report of a call already settled
    reported = usage.prompt_tokens is not None and usage.completion_tokens is not None
    spent = (usage.cost_nanos if call.charge.unit == "money"
             else usage.tokens if reported else None)
    _settle(conn, call.charge, call.charge.estimate if spent is None else spent)
    return bool(row["outcome"] == "answered")


CALL_FAILURES = ("refused", "failed")


def _check_failure(outcome: str) -> str:
    if outcome not in CALL_FAILURES:
        raise InvalidInput(f"a failed call's outcome is one of {', '.join(CALL_FAILURES)}, "
                           f"got {outcome!r}")
    return outcome


@transition(one_statement_on=EVERYWHERE)
def record_failure_txn(conn: Connection, call: InFlight, outcome: str, error: str,
                       usage: Usage) -> None:
    """Record the call refused (the provider's error reply: not billed) or failed (no usable
    answer); a call already settled is left as it is."""
    _END.rows(conn, call_id=call.call_id, outcome=_check_failure(outcome),
              error=error_text(error), **usage.params())


@transition(one_statement_on=NOWHERE)
def record_failure_and_release_txn(conn: Connection, call: InFlight, outcome: str, error: str,
                                   usage: Usage) -> None:
    """As ``record_failure_txn``, and release the call's budget reservation."""
    row = _END.first(conn, call_id=call.call_id, outcome=_check_failure(outcome),
                     error=error_text(error), **usage.params())
    if row is not None:
        _settle(conn, call.charge, 0)


@transition(one_statement_on=NOWHERE)
def mark_lost_txn(conn: Connection, run_id: str) -> list[str]:
    """Mark lost the Run's calls in flight whose Attempt no longer holds a lease, each
    charged its estimate in its budget windows (a call that left may have been billed); the
    ids of the calls marked."""
    marked = _LOST.rows(conn, run_id=run_id)
    for row in marked:
        if row["estimate"]:
            if row["budget_period"] is not None:
                budgets.settle(conn, row["job"], "period", row["budget_period"], row["estimate"],
                               row["estimate"])
            if row["budget_day"] is not None:
                budgets.settle(conn, row["job"], "day", _midnight(row["budget_day"]),
                               row["estimate"], row["estimate"])
    return [row["call_id"] for row in marked]


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


@transition(one_statement_on=EVERYWHERE)
def replay_txn(conn: Connection, claim: Claim, position: int,
               prompt_digest: str) -> Checkpoint | None:
    """The checkpointed answer of this position of the Run's transform for a prompt with the
    same digest, counted as reused; None when there is none (or the lease is no longer held)."""
    row = _REPLAY.first(conn, **_holder_params(claim), position=position,
                        prompt_digest=prompt_digest)
    return Checkpoint(row["call_id"], row["answer"]) if row else None


@transition(one_statement_on=EVERYWHERE)
def reject_answers_txn(conn: Connection, claim: Claim) -> list[str]:
    """Validation rejected the Run's candidate: its checkpointed answers are kept as evidence
    and never replayed; only the holder of the Run's lease can say so."""
    return [row["call_id"] for row in _REJECT.rows(conn, **_holder_params(claim))]


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


@transition(one_statement_on=EVERYWHERE)
def count_saved_txn(conn: Connection, job: str, day: date, run_ids: Sequence[str]) -> None:
    """Add the answered calls' stored cost of each duplicate Run one tick suppressed
    (``run_ids``, once per tick each) to what ``job``'s suppressed duplicates would have cost
    on ``day`` (UTC)."""
    if run_ids:
        _COUNT_SAVED.rows(conn, job=job, day=day, ids=[{"run_id": r} for r in run_ids])


def read_saved_since(conn: Connection, day: date, job: str | None = None) -> list[dict[str, Any]]:
    """What suppressed duplicates would have cost from ``day`` on, as plain rows."""
    return _SAVED_SINCE.rows(conn, day=day, job=job)
