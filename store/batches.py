"""Provider batches: a job's model calls queued (``store.model_calls``, outcome ``queued``)
are sent through a provider's Batch API together, and the Runs that queued them wait
(``waiting``: never claimed) until the batch's results settle their calls.

A Run goes ``running -> waiting`` (``wait_for_batch_txn``). A submitter opens a batch of one
job and endpoint (``open_batch_txn``: its queued calls that no batch holds, stamped with the
batch's key, and the batch row holding its lease), stores the provider's file id and batch id
(``record_file_txn``, ``record_submitted_txn``). A poller leases a batch (``claim_batch_txn``,
``claim_due_batches_txn``: fenced, database clock), notes the provider's status while it runs
(``record_polled_txn``), settles each result line once (``settle_results_txn``) and finishes it
(``finish_batch_txn``: calls without a result queued again, waiting Runs released or failed).
Every write to a batch or its calls is guarded by the batch's lease (key, fence, owner, not
expired by the database clock), judged in the statement itself. Each ``*_txn`` function takes
an open connection and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store import budgets
from store.batch_tables import (
    BATCH_KINDS,
    IN_DOUBT_WHERE,
    INLINE_FILE,
    LEASED_STATUSES,
    Batch,
    batches_table,
)
from store.call_plan import CALL_FAILURES, WITHDRAWN, End, reserved_windows, settle_end
from store.call_tables import UNBATCHED_WHERE, ModelCall, model_calls_table
from store.dialect import db_now, json_rows, skip_locked
from store.errors import InvalidInput, LeaseLost
from store.identity import document_digest
from store.lease import lease_until
from store.model_calls import WITHOUT_DOCUMENTS, end_values
from store.models import Run, runs_table
from store.run_reads import run_from_row
from store.statement import EVERYWHERE, NOWHERE, Statement, one_of, optional, param, transition
from store.validators import check_owner, check_seconds, error_text

batches = batches_table
calls = model_calls_table
runs = runs_table

MAX_KEY = 64


@dataclass(frozen=True)
class BatchClaim:
    """Proof of holding a batch's lease: every write to it presents (key, fence, owner); with
    what its holder needs to submit or poll it."""

    key: str
    fence: int
    owner: str
    status: str
    job: str
    endpoint: str
    model: str
    kind: str
    provider_file_id: str | None
    provider_batch_id: str | None
    flow_run_id: str | None
    period_start: datetime | None
    deadline_at: datetime | None
    requests: int
    created_at: datetime  # when its intent was committed (database clock)


# What storing a batch's file id did (see ``record_file_txn``).
FileRecorded = Literal["recorded", "lost", "busy"]


@dataclass(frozen=True)
class BatchLine:
    """One line of a batch's file: its id and the request body it sends."""

    custom_id: str
    request: dict[str, Any]


@dataclass(frozen=True)
class OpenedBatch:
    """A batch just opened: its lease, and the lines of its file in ``custom_id`` order."""

    claim: BatchClaim
    lines: list[BatchLine]


@dataclass(frozen=True)
class BatchCounts:
    """The provider's counts of a batch's requests as it reported them (None: not reported)."""

    total: int | None = None
    completed: int | None = None
    failed: int | None = None


@dataclass(frozen=True)
class RunRef:
    """A Run a finished batch released or failed."""

    run_id: str
    job: str
    subject: str
    period_start: datetime


@dataclass(frozen=True)
class ReleasedRun:
    """A pending Run a settled batch released: ``synchronous`` when one of its calls was
    withdrawn from batch mode (its deadline near), to be called without a batch."""

    run: Run
    synchronous: bool


@dataclass(frozen=True)
class TickRef:
    """A tick whose calls a batch held: its flow run, job and period."""

    flow_run_id: str
    job: str
    period_start: datetime


@dataclass(frozen=True)
class OrphanedQueue:
    """Queued calls of a job and endpoint no batch holds, left by a tick that died before it
    opened their batch: the model and when the oldest was queued."""

    job: str
    endpoint: str
    model: str
    oldest: datetime


@dataclass(frozen=True)
class FinishedBatch:
    """What finishing a batch did: the waiting Runs it released (pending again) and failed (a
    call refused or failed), how many of its calls went back to the queue, and the ticks
    whose calls it held."""

    released: list[RunRef]
    failed: list[RunRef]
    requeued: int
    ticks: list[TickRef]


# --- statements: one name and one rule each (store/sql/<dialect>.sql shows what they send) ---

_CLAIM_COLUMNS = [batches.c.batch_key, *(batches.c[f.name] for f in fields(BatchClaim)
                                         if f.name != "key")]
_REF_COLUMNS = [runs.c[f.name] for f in fields(RunRef)]
_LINEAGE = [c for c in runs.c if c.key not in ("raw_input", "output")]


def _held() -> sa.ColumnElement[bool]:
    """The batch is held under exactly the presented key, fence and owner, its lease not
    expired by the database clock."""
    return sa.and_(
        batches.c.batch_key == param(batches.c.batch_key),
        batches.c.fence == param(batches.c.fence),
        batches.c.owner == param(batches.c.owner),
        one_of(batches.c.status, LEASED_STATUSES),
        batches.c.lease_expires_at > db_now(),
    )


def _batch_held() -> sa.Exists:
    """The presented claim holds the batch (as a subquery: a guard of a write to its calls)."""
    return sa.exists(sa.select(batches.c.batch_key).where(_held()))


def _free() -> sa.ColumnElement[bool]:
    """A batch in flight whose lease is free or expired (database clock)."""
    return sa.and_(one_of(batches.c.status, LEASED_STATUSES),
                   sa.or_(batches.c.lease_expires_at.is_(None),
                          batches.c.lease_expires_at <= db_now()))


def _lease_taken() -> dict[str, Any]:
    return {"fence": batches.c.fence + 1, "owner": param(batches.c.owner),
            "lease_expires_at": lease_until()}


def _queued_of(run_id: Any) -> sa.Exists:
    return sa.exists(sa.select(calls.c.call_id).where(calls.c.run_id == run_id,
                                                      calls.c.outcome == "queued"))


_WAIT = Statement(
    "wait_for_batch", "A running Run whose calls are queued in a batch waits for it (never "
    "claimed), its lease cleared and the attempt it took given back; pending at once when "
    "none of its calls is still queued (its batch settled already); only the current fence "
    "holder can.",
    lambda d: budgets.give_back(sa.case((_queued_of(runs.c.run_id), "waiting"),
                                        else_="pending")))

_END_WAITING_ATTEMPT = Statement(
    "end_waiting_attempt", "The Attempt of a Run that waits for its batch ends released, with "
    "its note.",
    lambda d: budgets.end_released_attempt())

_QUEUED_BEFORE = sa.bindparam("queued_before", type_=sa.DateTime(timezone=True))

_PICK = Statement(
    "pick_queued_calls", "The oldest queued calls of a job and endpoint that no batch holds "
    "(queued before the given time, if one is given), at most the limit, skipping rows another "
    "submitter has locked (PostgreSQL).",
    lambda d: skip_locked(
        sa.select(calls.c.call_id, calls.c.custom_id, calls.c.request, calls.c.queued_tokens)
        .where(sa.text(UNBATCHED_WHERE), calls.c.endpoint == param(calls.c.endpoint),
               calls.c.job == param(calls.c.job),
               sa.or_(_QUEUED_BEFORE.is_(None), calls.c.started_at < _QUEUED_BEFORE))
        .order_by(calls.c.started_at, calls.c.call_id)
        .limit(sa.bindparam("limit", type_=sa.Integer())), d))

_ENQUEUED = Statement(
    "count_enqueued_tokens", "The prompt tokens an endpoint's calls hold in its batches open or "
    "submitted (what its provider's enqueued-token limit counts).",
    lambda d: sa.select(sa.func.coalesce(sa.func.sum(calls.c.queued_tokens), 0).label("tokens"))
    .select_from(calls.join(batches, batches.c.batch_key == calls.c.batch_key))
    .where(batches.c.endpoint == param(batches.c.endpoint),
           one_of(batches.c.status, LEASED_STATUSES), calls.c.outcome == "queued"))

_OPEN = Statement(
    "open_batch", "Insert a batch open, its lease held by the submitter that opened it (fence "
    "1, database clock), with how many calls it holds, the digest of its lines and its "
    "deadline.",
    lambda d: sa.insert(batches).values(
        batch_key=param(batches.c.batch_key), job=param(batches.c.job),
        endpoint=param(batches.c.endpoint), model=param(batches.c.model),
        kind=param(batches.c.kind), status="open", flow_run_id=param(batches.c.flow_run_id),
        period_start=param(batches.c.period_start), deadline_at=param(batches.c.deadline_at),
        input_digest=param(batches.c.input_digest),
        requests=param(batches.c.requests), fence=1, owner=param(batches.c.owner),
        lease_expires_at=lease_until(), created_at=db_now(),
    ).returning(*_CLAIM_COLUMNS))

_STAMP = Statement(
    "stamp_batch_calls", "The picked calls, still queued and in no batch, are held by the batch "
    "(given as one JSON array).",
    lambda d: sa.update(calls)
    .where(calls.c.call_id.in_(json_rows(d, "ids", [calls.c.call_id])),
           calls.c.outcome == "queued", calls.c.batch_key.is_(None))
    .values(batch_key=param(calls.c.batch_key))
    .returning(calls.c.call_id))

_CLAIM = Statement(
    "claim_batch", "Take the lease of a batch in flight (open or submitted) whose lease is free "
    "or expired (database clock): bump its fence.",
    lambda d: sa.update(batches)
    .where(batches.c.batch_key == param(batches.c.batch_key), _free())
    .values(**_lease_taken())
    .returning(*_CLAIM_COLUMNS))


def _claim_due(d: str) -> Any:
    due = skip_locked(
        sa.select(batches.c.batch_key).where(_free())
        .order_by(batches.c.created_at, batches.c.batch_key)
        .limit(sa.bindparam("limit", type_=sa.Integer())), d)
    return (sa.update(batches)
            .where(batches.c.batch_key.in_(due.scalar_subquery()), _free())
            .values(**_lease_taken())
            .returning(*_CLAIM_COLUMNS))


_CLAIM_DUE = Statement(
    "claim_due_batches", "Lease the oldest batches in flight whose lease is free or expired "
    "(database clock), at most the limit, skipping rows another poller has locked "
    "(PostgreSQL); each claim bumps the fence.", _claim_due)

_LINES = Statement(
    "list_batch_lines", "The lines of a batch's file (its calls' ids and request bodies), in "
    "custom_id order.",
    lambda d: sa.select(calls.c.custom_id, calls.c.request)
    .where(calls.c.batch_key == param(calls.c.batch_key))
    .order_by(calls.c.custom_id))

_FILE = Statement(
    "record_batch_file", "Store the id of the batch's uploaded file and extend the lease (its "
    "holder creates the batch next: no other may take it meanwhile); only the holder of the "
    "batch's lease can.",
    lambda d: sa.update(batches).where(_held())
    .values(provider_file_id=param(batches.c.provider_file_id), lease_expires_at=lease_until())
    .returning(batches.c.batch_key))

_IN_DOUBT = Statement(
    "find_batch_create_in_doubt", "Another open batch of the kind whose requests go with its "
    "create has its file id stored and no provider id yet: its create is in doubt.",
    lambda d: sa.select(batches.c.batch_key)
    .where(batches.c.kind == param(batches.c.kind),
           batches.c.batch_key != param(batches.c.batch_key), sa.text(IN_DOUBT_WHERE))
    .limit(1))

_RELEASE = Statement(
    "release_batch_lease", "Give the batch's lease back at once (the next poll takes it); only "
    "the holder of the batch's lease can.",
    lambda d: sa.update(batches).where(_held()).values(lease_expires_at=db_now())
    .returning(batches.c.batch_key))

_FORGET_FILE = Statement(
    "forget_batch_file", "Clear the file id of a batch its provider refused to create (its "
    "create is no longer in doubt); only the holder of the batch's lease can.",
    lambda d: sa.update(batches).where(_held(), batches.c.provider_batch_id.is_(None))
    .values(provider_file_id=sa.null())
    .returning(batches.c.batch_key))

_SUBMITTED = Statement(
    "record_batch_submitted", "The provider has the batch: its id and status stored, the batch "
    "submitted and its lease released; only the holder of the batch's lease can.",
    lambda d: sa.update(batches).where(_held())
    .values(status="submitted", provider_batch_id=param(batches.c.provider_batch_id),
            provider_status=param(batches.c.provider_status), submitted_at=db_now(),
            owner=sa.null(), lease_expires_at=sa.null())
    .returning(batches.c.batch_key))

_POLLED = Statement(
    "record_batch_polled", "A batch still running at the provider: its status and counts as "
    "reported noted and its lease released; only the holder of the batch's lease can.",
    lambda d: sa.update(batches).where(_held())
    .values(provider_status=param(batches.c.provider_status),
            provider_total=param(batches.c.provider_total),
            provider_completed=param(batches.c.provider_completed),
            provider_failed=param(batches.c.provider_failed), polled_at=db_now(),
            owner=sa.null(), lease_expires_at=sa.null())
    .returning(batches.c.batch_key))

_SETTLE_LINE = Statement(
    "settle_batch_call", "A call of the batch still queued ends as its result line says "
    "(answered with its checkpoint, or refused or failed with its error), with its usage; "
    "only while the batch's lease is held.",
    lambda d: sa.update(calls)
    .where(calls.c.batch_key == param(calls.c.batch_key),
           calls.c.custom_id == param(calls.c.custom_id), calls.c.outcome == "queued",
           _batch_held())
    .values(outcome=param(calls.c.outcome), answer=param(calls.c.answer),
            error=param(calls.c.error), **end_values())
    .returning(calls.c.call_id, calls.c.custom_id, calls.c.job, calls.c.estimate,
               calls.c.budget_period, calls.c.budget_day))


def _of_batch(*where: Any) -> sa.Select[Any]:
    return sa.select(sa.func.count()).where(calls.c.batch_key == batches.c.batch_key, *where)


def _finish(d: str) -> Any:
    in_batch = calls.c.batch_key == batches.c.batch_key
    return (
        sa.update(batches).where(_held())
        .values(status="settled", provider_status=param(batches.c.provider_status),
                error=param(batches.c.error), settled_at=db_now(), owner=sa.null(),
                lease_expires_at=sa.null(),
                answered=_of_batch(calls.c.outcome == "answered").scalar_subquery(),
                refused=_of_batch(calls.c.outcome == "refused").scalar_subquery(),
                failed=_of_batch(calls.c.outcome == "failed").scalar_subquery(),
                requeued=_of_batch(calls.c.outcome == "queued").scalar_subquery(),
                withdrawn=_of_batch(calls.c.outcome == WITHDRAWN).scalar_subquery(),
                cost_nanos=sa.select(sa.func.sum(calls.c.cost_nanos)).where(in_batch)
                .scalar_subquery(),
                currency=sa.select(sa.func.max(calls.c.currency)).where(in_batch)
                .scalar_subquery())
        .returning(batches.c.requeued))


_FINISH = Statement(
    "finish_batch", "The batch is settled: what became of its calls counted (answered, refused, "
    "failed, still queued, withdrawn) and their cost added up, the provider's last status noted, its "
    "lease released; only the holder of the batch's lease can.", _finish)

_REQUEUE = Statement(
    "requeue_batch_calls", "The calls of a finished batch that no result settled (expired, "
    "cancelled, a transient line error) go back to the queue for the next batch.",
    lambda d: sa.update(calls)
    .where(calls.c.batch_key == param(calls.c.batch_key), calls.c.outcome == "queued")
    .values(batch_key=sa.null())
    .returning(calls.c.call_id))


def _refused_in_batch(run_id: Any) -> sa.Select[Any]:
    return (sa.select(calls.c.error)
            .where(calls.c.run_id == run_id, calls.c.batch_key == param(calls.c.batch_key),
                   one_of(calls.c.outcome, CALL_FAILURES))
            .order_by(calls.c.finished_at, calls.c.call_id).limit(1))


def _in_batch(run_id: Any) -> sa.Exists:
    return sa.exists(sa.select(calls.c.call_id).where(
        calls.c.run_id == run_id, calls.c.batch_key == param(calls.c.batch_key)))


_FAIL_WAITING = Statement(
    "fail_waiting_runs", "A waiting Run none of whose calls is still queued fails when one of "
    "its calls in the finished batch was refused or failed, with that call's error.",
    lambda d: sa.update(runs)
    .where(runs.c.status == "waiting", ~_queued_of(runs.c.run_id),
           sa.exists(_refused_in_batch(runs.c.run_id)))
    .values(status="failed", error=_refused_in_batch(runs.c.run_id).scalar_subquery(),
            updated_at=db_now())
    .returning(*_REF_COLUMNS))

_RELEASE_WAITING = Statement(
    "release_waiting_runs", "A waiting Run with calls in the finished batch and none still "
    "queued is pending again: a tick runs it and replays its settled answers.",
    lambda d: sa.update(runs)
    .where(runs.c.status == "waiting", ~_queued_of(runs.c.run_id), _in_batch(runs.c.run_id))
    .values(status="pending", error=sa.null(), updated_at=db_now())
    .returning(*_REF_COLUMNS))

_ORPHANS = Statement(
    "list_orphaned_queues", "The jobs and endpoints with queued calls that no batch holds, "
    "queued before the given time (their tick died before it opened their batch): each with "
    "its model and when its oldest such call was queued.",
    lambda d: sa.select(calls.c.job, calls.c.endpoint, sa.func.max(calls.c.model).label("model"),
                        sa.func.min(calls.c.started_at).label("oldest"))
    .where(sa.text(UNBATCHED_WHERE), calls.c.started_at < _QUEUED_BEFORE)
    .group_by(calls.c.job, calls.c.endpoint)
    .order_by(calls.c.job, calls.c.endpoint))

_TICKS_OF = Statement(
    "list_batch_ticks", "The ticks whose calls a batch holds or settled: each flow run that "
    "queued them, with its job and period.",
    lambda d: sa.select(calls.c.flow_run_id, runs.c.job, runs.c.period_start).distinct()
    .select_from(calls.join(runs, runs.c.run_id == calls.c.run_id))
    .where(calls.c.batch_key == param(calls.c.batch_key), calls.c.flow_run_id.is_not(None))
    .order_by(calls.c.flow_run_id))

_LIST = Statement(
    "list_batches", "The latest batches, newest first, optionally of one status.",
    lambda d: sa.select(batches).where(optional(batches.c.status))
    .order_by(batches.c.created_at.desc(), batches.c.batch_key)
    .limit(sa.bindparam("limit", type_=sa.Integer())))

_GET = Statement(
    "get_batch", "A batch by its key or by the provider's batch id.",
    lambda d: sa.select(batches)
    .where(sa.or_(batches.c.batch_key == sa.bindparam("key", type_=sa.String()),
                  batches.c.provider_batch_id == sa.bindparam("key", type_=sa.String())))
    .order_by(batches.c.created_at).limit(1))

_SUBMITTED_SINCE = Statement(
    "list_batch_ids_submitted_since", "The provider batch ids of the batches submitted since "
    "a time.",
    lambda d: sa.select(batches.c.provider_batch_id)
    .where(batches.c.provider_batch_id.is_not(None),
           batches.c.submitted_at >= sa.bindparam("since", type_=batches.c.submitted_at.type)))

_CALLS_OF = Statement(
    "list_batch_calls", "The model calls a batch holds or settled, in custom_id order, without "
    "answers (nor requests).",
    lambda d: sa.select(*WITHOUT_DOCUMENTS)
    .where(calls.c.batch_key == param(calls.c.batch_key))
    .order_by(calls.c.custom_id))



def _withdrawn_of(run_id: Any) -> sa.Exists:
    return sa.exists(sa.select(calls.c.call_id).where(calls.c.run_id == run_id,
                                                      calls.c.outcome == WITHDRAWN))


_RELEASED = Statement(
    "list_released_runs", "The pending Runs a settled batch released and no attempt ran yet: "
    "an answered batch call of theirs waits to be replayed, or a withdrawn one to be called "
    "synchronously; oldest period first, at most the limit, without documents; ``withdrawn`` "
    "tells the latter.",
    lambda d: sa.select(*_LINEAGE, _withdrawn_of(runs.c.run_id).label("withdrawn"))
    .where(runs.c.status == "pending", sa.or_(_withdrawn_of(runs.c.run_id), sa.exists(
        sa.select(calls.c.call_id).where(calls.c.run_id == runs.c.run_id,
                                         calls.c.batch_key.is_not(None),
                                         calls.c.outcome == "answered",
                                         calls.c.rejected_at.is_(None)))))
    .order_by(runs.c.period_start, runs.c.job, runs.c.subject, runs.c.revision)
    .limit(sa.bindparam("limit", type_=sa.Integer())))

_UNSETTLED_TICKS = Statement(
    "list_unsettled_tick_flow_runs", "The flow runs of the ticks a queued call of which still "
    "waits (in a batch, or for one).",
    lambda d: sa.select(calls.c.flow_run_id).distinct()
    .where(calls.c.outcome == "queued", calls.c.flow_run_id.is_not(None)))

_WAITING = Statement(
    "list_waiting_runs", "The Runs waiting for a batch, optionally of one job, oldest period "
    "first, without documents.",
    lambda d: sa.select(*_LINEAGE)
    .where(runs.c.status == "waiting", optional(runs.c.job))
    .order_by(runs.c.period_start, runs.c.job, runs.c.subject, runs.c.revision))


# --- transitions ----------------------------------------------------------------------------


def _ref_order(ref: RunRef) -> tuple[datetime, str, str]:
    return ref.period_start, ref.job, ref.subject


def _claim_from(row: dict[str, Any]) -> BatchClaim:
    return BatchClaim(key=row["batch_key"], **{f.name: row[f.name] for f in fields(BatchClaim)
                                               if f.name != "key"})


def _presented(claim: BatchClaim) -> dict[str, Any]:
    return {"batch_key": claim.key, "fence": claim.fence, "owner": claim.owner}


def _fitting(picked: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
    """The oldest of ``picked`` whose tokens fit in ``room``, in order."""
    fitting: list[dict[str, Any]] = []
    for row in picked:
        room -= row["queued_tokens"] or 0
        if room < 0:
            break
        fitting.append(row)
    return fitting


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY:
        raise InvalidInput(f"a batch key is non-empty text of at most {MAX_KEY} characters, "
                           f"got {key!r}")
    return key


@transition(one_statement_on=NOWHERE)
def wait_for_batch_txn(conn: Connection, run_id: str, fence: int, owner: str, attempt_id: str,
                       note: str) -> bool:
    """A running Run whose calls are queued waits for its batch (pending when none is still
    queued), its attempt given back and its Attempt ended released with ``note``; False
    (nothing written) when this fence no longer holds it."""
    row = _WAIT.first(conn, run_id=run_id, fence=fence, owner=owner, error=note)
    if row is None:
        return False
    _END_WAITING_ATTEMPT.rows(conn, attempt_id=attempt_id, error=note)
    return True


@transition(one_statement_on=NOWHERE)
def open_batch_txn(conn: Connection, key: str, *, job: str, endpoint: str, model: str, kind: str,
                   owner: str, lease_seconds: float, max_requests: int,
                   flow_run_id: str | None, period_start: datetime | None,
                   deadline_at: datetime | None = None,
                   queued_before: datetime | None = None,
                   max_tokens: int | None = None) -> OpenedBatch | None:
    """Open a batch of the oldest queued calls of ``job`` and ``endpoint`` that no batch holds
    (at most ``max_requests``; only those queued before ``queued_before``, if given; with
    ``max_tokens``, only as many as the endpoint's batches in flight leave room for), its lease
    held by ``owner``, its calls waiting for batches until ``deadline_at``; None (nothing
    written) when no call waits, or none fits."""
    _check_key(key)
    check_owner(owner)
    lease = check_seconds(lease_seconds, "lease")
    if kind not in BATCH_KINDS:
        raise InvalidInput(f"a batch's kind is one of {', '.join(BATCH_KINDS)}, got {kind!r}")
    if isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1:
        raise InvalidInput(f"max_requests must be a positive integer, got {max_requests!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise InvalidInput(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
    picked = _PICK.rows(conn, job=job, endpoint=endpoint, limit=max_requests,
                        queued_before=queued_before)
    if max_tokens is not None and picked:
        enqueued = _ENQUEUED.first(conn, endpoint=endpoint)
        assert enqueued is not None  # an aggregate returns one row
        picked = _fitting(picked, max_tokens - int(enqueued["tokens"]))
    if not picked:
        return None
    lines = sorted((BatchLine(row["custom_id"], row["request"]) for row in picked),
                   key=lambda line: line.custom_id)
    digest = document_digest([{"custom_id": line.custom_id, "request": line.request}
                              for line in lines], "batch lines")
    row = _OPEN.first(conn, batch_key=key, job=job, endpoint=endpoint, model=model, kind=kind,
                      flow_run_id=flow_run_id, period_start=period_start,
                      deadline_at=deadline_at, input_digest=digest,
                      requests=len(lines), owner=owner, lease=lease)
    assert row is not None  # an insert returns its row
    _STAMP.rows(conn, batch_key=key, ids=[{"call_id": r["call_id"]} for r in picked])
    return OpenedBatch(_claim_from(row), lines)


@transition(one_statement_on=EVERYWHERE)
def claim_batch_txn(conn: Connection, key: str, owner: str,
                    lease_seconds: float) -> BatchClaim | None:
    """Take the lease of the batch ``key`` in flight (open or submitted) if it is free or
    expired (database clock), bumping its fence; None otherwise."""
    check_owner(owner)
    row = _CLAIM.first(conn, batch_key=key, owner=owner,
                       lease=check_seconds(lease_seconds, "lease"))
    return None if row is None else _claim_from(row)


@transition(one_statement_on=EVERYWHERE)
def claim_due_batches_txn(conn: Connection, owner: str, lease_seconds: float,
                          limit: int) -> list[BatchClaim]:
    """Lease up to ``limit`` batches in flight whose lease is free or expired, oldest first,
    skipping those another poller is taking (PostgreSQL); each claim bumps the fence."""
    check_owner(owner)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput(f"limit must be a positive integer, got {limit!r}")
    rows = _CLAIM_DUE.rows(conn, owner=owner, lease=check_seconds(lease_seconds, "lease"),
                           limit=limit)
    return sorted((_claim_from(row) for row in rows), key=lambda c: c.key)


def batch_lines(conn: Connection, key: str) -> list[BatchLine]:
    """The lines of a batch's file in ``custom_id`` order (an open batch taken over rebuilds
    its file from them)."""
    return [BatchLine(row["custom_id"], row["request"]) for row in _LINES.rows(conn, batch_key=key)]


def _uploaded(claim: BatchClaim, file_id: str, lease_seconds: float) -> bool:
    return file_id != INLINE_FILE


@transition(one_statement_on=EVERYWHERE, when=_uploaded)
def record_file_txn(conn: Connection, claim: BatchClaim, file_id: str,
                    lease_seconds: float) -> FileRecorded:
    """Store the id of the batch's file, the lease extended by ``lease_seconds``: ``recorded``;
    ``lost`` when the lease is no longer held; ``busy`` (the lease given back) for an
    ``inline`` file while another batch of its kind has its create in doubt."""
    lease = check_seconds(lease_seconds, "lease")
    if file_id == INLINE_FILE and _IN_DOUBT.first(conn, kind=claim.kind,
                                                  batch_key=claim.key) is not None:
        return "busy" if _RELEASE.first(conn, **_presented(claim)) is not None else "lost"
    recorded = _FILE.first(conn, **_presented(claim), provider_file_id=file_id, lease=lease)
    return "lost" if recorded is None else "recorded"


@transition(one_statement_on=EVERYWHERE)
def forget_file_txn(conn: Connection, claim: BatchClaim) -> bool:
    """Clear the file id of a batch its provider refused to create (a 4xx reply: no batch was
    made), so that its create is no longer in doubt; False when the lease is not held."""
    return _FORGET_FILE.first(conn, **_presented(claim)) is not None


@transition(one_statement_on=EVERYWHERE)
def record_submitted_txn(conn: Connection, claim: BatchClaim, provider_batch_id: str,
                         provider_status: str) -> bool:
    """open -> submitted with the provider's batch id and status, the lease released; False
    when the lease is no longer held."""
    return _SUBMITTED.first(conn, **_presented(claim), provider_batch_id=provider_batch_id,
                            provider_status=provider_status) is not None


@transition(one_statement_on=EVERYWHERE)
def record_polled_txn(conn: Connection, claim: BatchClaim, provider_status: str,
                      counts: BatchCounts) -> bool:
    """A batch still running: the provider's status and counts noted, the lease released;
    False when the lease is no longer held."""
    return _POLLED.first(conn, **_presented(claim), provider_status=provider_status,
                         provider_total=counts.total, provider_completed=counts.completed,
                         provider_failed=counts.failed) is not None


@transition(one_statement_on=NOWHERE)
def settle_results_txn(conn: Connection, claim: BatchClaim,
                       ends: Sequence[tuple[str, End]]) -> list[str]:
    """Each result line's call of this batch, still queued, ends as its End says (answered
    with its checkpoint, refused or failed with its error, with its usage) and its budget
    reservation is settled to the real cost; only while the batch's lease is held. The
    custom_ids settled now (not those settled before, nor any under a lost lease)."""
    settled: list[str] = []
    for custom_id, end in ends:
        answered = end.outcome == "answered"
        row = _SETTLE_LINE.first(
            conn, **_presented(claim), custom_id=custom_id, outcome=end.outcome,
            answer=end.answer if answered else None,
            error=None if answered else error_text(end.error or end.outcome),
            **end.usage.params())
        if row is None:
            continue
        windows = reserved_windows(row)
        if row["estimate"] and windows:
            scope, start = windows[0]
            unit = budgets.window_unit(conn, row["job"], scope, start)
            if unit is not None:
                settle_end(conn, row["job"], unit, row["estimate"], windows, end)
        settled.append(custom_id)
    return settled


@transition(one_statement_on=NOWHERE)
def finish_batch_txn(conn: Connection, claim: BatchClaim, provider_status: str,
                     error: str | None = None) -> FinishedBatch:
    """Settle the batch: its calls still queued go back to the queue, its counts and cost are
    recorded, its lease released; each waiting Run none of whose calls is still queued is
    pending again, or failed when one of its calls in this batch was refused or failed.
    ``LeaseLost`` (nothing written) when the lease is no longer held."""
    row = _FINISH.first(conn, **_presented(claim), provider_status=provider_status,
                        error=None if error is None else error_text(error))
    if row is None:
        raise LeaseLost(f"batch {claim.key}: fence {claim.fence} of {claim.owner} no longer "
                        "holds its lease; nothing was finished")
    _REQUEUE.rows(conn, batch_key=claim.key)
    failed = [RunRef(**r) for r in _FAIL_WAITING.rows(conn, batch_key=claim.key)]
    released = [RunRef(**r) for r in _RELEASE_WAITING.rows(conn, batch_key=claim.key)]
    return FinishedBatch(sorted(released, key=_ref_order), sorted(failed, key=_ref_order),
                         int(row["requeued"]),
                         [TickRef(**r) for r in _TICKS_OF.rows(conn, batch_key=claim.key)])


# --- reads ----------------------------------------------------------------------------------


def _batch(row: dict[str, Any]) -> Batch:
    return Batch.model_construct(**row)


def list_batches(conn: Connection, limit: int, status: str | None = None) -> list[Batch]:
    """The latest batches, newest first, optionally of one status."""
    return [_batch(row) for row in _LIST.rows(conn, limit=limit, status=status)]


def get_batch(conn: Connection, key_or_provider_id: str) -> Batch | None:
    """The batch with this key, or this provider batch id; None if there is none."""
    row = _GET.first(conn, key=key_or_provider_id)
    return None if row is None else _batch(row)


def submitted_since(conn: Connection, since: datetime) -> set[str]:
    """The provider batch ids of the batches submitted at or after ``since``."""
    return {row["provider_batch_id"] for row in _SUBMITTED_SINCE.rows(conn, since=since)}


def calls_of_batch(conn: Connection, key: str) -> list[ModelCall]:
    """The model calls a batch holds or settled, in custom_id order (no answers, no requests;
    a call its batch ended without is queued again and no longer its)."""
    return [ModelCall.model_construct(**row) for row in _CALLS_OF.rows(conn, batch_key=key)]


def released_runs(conn: Connection, limit: int) -> list[ReleasedRun]:
    """The pending Runs released by a settled batch and not run again yet, oldest period
    first: what a poll runs again, whoever released them (synchronously when a call of theirs
    was withdrawn from batch mode)."""
    return [ReleasedRun(run_from_row(row), bool(row["withdrawn"]))
            for row in _RELEASED.rows(conn, limit=limit)]


def orphaned_queues(conn: Connection, queued_before: datetime) -> list[OrphanedQueue]:
    """The jobs and endpoints with queued calls no batch holds, queued before
    ``queued_before``."""
    return [OrphanedQueue(**row) for row in _ORPHANS.rows(conn, queued_before=queued_before)]


def unsettled_flow_runs(conn: Connection) -> set[str]:
    """The flow runs of the ticks a queued call of which still waits."""
    return {row["flow_run_id"] for row in _UNSETTLED_TICKS.rows(conn)}


def waiting_runs(conn: Connection, job: str | None = None) -> list[Run]:
    """The Runs waiting for a batch (of ``job``, if given), oldest period first, without
    documents."""
    return [run_from_row(row) for row in _WAITING.rows(conn, job=job)]
