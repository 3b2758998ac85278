"""What a job owes and the durable decisions about it: from which period each subject is owed
(obligations), and per owed (subject, period) whether the missed-run policy skipped it,
whether it was reported overdue and then recovered, whether its Run was given up, and whether
each of these decisions' events is known to be emitted (occurrences). Reconcile reads these
with the job's Runs; each transition here is one guarded statement (a give-up: one
transaction), so two reconcile passes at once decide, and report, each occurrence once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.dialect import (
    db_now,
    insert_ignoring_conflicts,
    json_rows,
    json_timestamp,
    upsert,
)
from store.errors import InvalidInput
from store.identity import RunIdentity
from store.models import Occurrence, obligations_table, occurrences_table, runs_table
from store.statement import EVERYWHERE, NOWHERE, Statement, insert_rows, param, transition
from store.validators import check_seconds, error_text

obligations = obligations_table
occurrences = occurrences_table
runs = runs_table

GAVE_UP = "gave up after {attempts} attempts: {error}"
# Each decision about an occurrence (named like its event): when it was made, and when its
# event was known emitted (None: not yet, so the next pass emits it).
DECISIONS = {
    "skipped": (occurrences.c.skipped_at, occurrences.c.skip_emitted_at),
    "overdue": (occurrences.c.overdue_at, occurrences.c.overdue_emitted_at),
    "recovered": (occurrences.c.recovered_at, occurrences.c.recovered_emitted_at),
    "gave-up": (occurrences.c.gave_up_at, occurrences.c.gave_up_emitted_at),
}


@dataclass(frozen=True)
class RunState:
    """What reconcile needs of one of a job's Runs: where it stands, not its documents."""

    run_id: str
    subject: str
    period_start: datetime
    version: str
    status: str
    attempts: int
    updated_at: datetime
    error: str | None
    lease_expired: bool  # by the database clock; False when the Run holds no lease
    model_calls: int = 0  # spent by its Attempts that ended by a worker's hand

    @property
    def stranded(self) -> bool:
        """Pending, or running on a lease that expired: its flow run ended without finishing."""
        return self.status == "pending" or (self.status == "running" and self.lease_expired)


# --- statements -----------------------------------------------------------------------------

_OWE = Statement(
    "owe_subjects", "Record from which period a job owes each given subject, once: a subject "
    "already recorded keeps its first value.",
    lambda d: insert_rows(insert_ignoring_conflicts(d, obligations),
        ["job", "subject", "owed_from", "created_at"],
        sa.select(*json_rows(d, "owed", [obligations.c.job, obligations.c.subject,
                                         obligations.c.owed_from]).subquery("given").c,
                  db_now()).where(sa.true())))
_OWED = Statement(
    "read_obligations", "The subjects a job owes and the period each is owed from.",
    lambda d: sa.select(obligations.c.subject, obligations.c.owed_from)
    .where(obligations.c.job == param(obligations.c.job)).order_by(obligations.c.subject))

_OCCURRENCE = [occurrences.c.run_id, occurrences.c.job, occurrences.c.subject,
               occurrences.c.period_start, occurrences.c.version]


def _given(d: str, *extra: sa.Column[Any]) -> sa.Subquery:
    return json_rows(d, "occurrences", [*_OCCURRENCE, *extra]).subquery("given")


def _no_run(given: sa.Subquery, *statuses: str) -> sa.ColumnElement[bool]:
    """No Run of this identity exists (in one of ``statuses``, if given)."""
    found = sa.select(runs.c.run_id).where(runs.c.run_id == given.c.run_id)
    if statuses:
        found = found.where(sa.or_(*(runs.c.status == s for s in statuses)))
    return ~sa.exists(found)


def _skip(d: str) -> Any:
    given = _given(d, occurrences.c.skip_reason)
    now = db_now()
    insert = insert_rows(upsert(d, occurrences),
        [*(c.key for c in _OCCURRENCE), "skip_reason", "skipped_at", "created_at", "updated_at"],
        sa.select(*given.c, now, now, now).where(_no_run(given)),
    )
    return insert.on_conflict_do_update(
        index_elements=[occurrences.c.run_id],
        set_={"skipped_at": insert.excluded.skipped_at, "skip_reason": insert.excluded.skip_reason,
              "skip_emitted_at": sa.null(),  # skipped again after an unskip: a new event
              "updated_at": insert.excluded.updated_at},
        where=occurrences.c.skipped_at.is_(None),
    ).returning(occurrences.c.run_id)


_SKIP = Statement(
    "skip_occurrences", "Record each given occurrence as skipped by the missed-run policy, with "
    "its reason, unless a Run of it exists (started occurrences are re-driven, never skipped) "
    "or it is skipped already.", _skip)
_UNSKIP = Statement(
    "unskip_occurrences", "An operator runs skipped occurrences on purpose: their skip is "
    "cleared (the reason stays until it runs).",
    lambda d: sa.update(occurrences)
    .where(occurrences.c.run_id.in_(json_rows(d, "ids", [occurrences.c.run_id])),
           occurrences.c.skipped_at.is_not(None))
    .values(skipped_at=sa.null(), updated_at=db_now())
    .returning(occurrences.c.run_id))


def _overdue(d: str) -> Any:
    given = _given(d)
    now = db_now()
    insert = insert_rows(upsert(d, occurrences),
        [*(c.key for c in _OCCURRENCE), "overdue_at", "created_at", "updated_at"],
        sa.select(*given.c, now, now, now).where(_no_run(given, "completed")),
    )
    return insert.on_conflict_do_update(
        index_elements=[occurrences.c.run_id],
        set_={"overdue_at": insert.excluded.overdue_at, "updated_at": insert.excluded.updated_at},
        where=sa.and_(occurrences.c.overdue_at.is_(None), occurrences.c.skipped_at.is_(None)),
    ).returning(occurrences.c.run_id)


_OVERDUE = Statement(
    "mark_overdue", "Report each given occurrence overdue once: not if its Run completed, it was "
    "skipped by policy or it was reported already.", _overdue)
_RECOVERED = Statement(
    "mark_recovered", "An overdue occurrence of the job whose Run has since completed is reported "
    "recovered, once.",
    lambda d: sa.update(occurrences)
    .where(occurrences.c.job == param(occurrences.c.job),
           occurrences.c.overdue_at.is_not(None), occurrences.c.recovered_at.is_(None),
           sa.exists(sa.select(runs.c.run_id).where(runs.c.run_id == occurrences.c.run_id,
                                                     runs.c.status == "completed")))
    .values(recovered_at=db_now(), updated_at=db_now())
    .returning(*occurrences.c))

_GIVE_UP = Statement(
    "give_up_run", "A stranded Run (pending, or running on an expired lease) that used up its "
    "attempts fails for good, naming its last error; a live or finished Run is left alone.",
    lambda d: sa.update(runs)
    .where(runs.c.run_id == param(runs.c.run_id),
           runs.c.attempts >= sa.bindparam("max_attempts", type_=sa.Integer()),
           sa.or_(runs.c.status == "pending",
                  sa.and_(runs.c.status == "running", runs.c.lease_expires_at <= db_now())))
    .values(status="failed", owner=sa.null(), lease_expires_at=sa.null(),
            error=param(runs.c.error), updated_at=db_now())
    .returning(runs.c.job, runs.c.subject, runs.c.period_start, runs.c.version))


def _gave_up(d: str) -> Any:
    given = _given(d)
    now = db_now()
    insert = insert_rows(upsert(d, occurrences),
        [*(c.key for c in _OCCURRENCE), "gave_up_at", "created_at", "updated_at"],
        sa.select(*given.c, now, now, now).where(sa.true()),
    )
    return insert.on_conflict_do_update(
        index_elements=[occurrences.c.run_id],
        set_={"gave_up_at": insert.excluded.gave_up_at, "gave_up_emitted_at": sa.null(),
              "updated_at": insert.excluded.updated_at})


_GAVE_UP = Statement(
    "record_give_up", "A Run given up is recorded on its occurrence (a new give-up after an "
    "operator's requeue is a new decision, its event not emitted yet).", _gave_up)


def _unemitted() -> sa.ColumnElement[bool]:
    return sa.or_(*(sa.and_(at.is_not(None), emitted.is_(None)) for at, emitted in DECISIONS.values()))


_CLAIM_EVENTS = Statement(
    "claim_decision_events", "Lease the job's occurrences that have a decision whose event is not "
    "known to be emitted, unless another pass holds them on a live lease (database clock).",
    lambda d: sa.update(occurrences)
    .where(occurrences.c.job == param(occurrences.c.job), _unemitted(),
           sa.or_(occurrences.c.emitting_until.is_(None), occurrences.c.emitting_until <= db_now()))
    .values(emitting_until=db_now(sa.bindparam("lease", type_=sa.Float())))
    .returning(*occurrences.c))


def _mark_emitted(d: str) -> Any:
    given = json_rows(d, "emitted", [occurrences.c.run_id, *(at for at, _ in DECISIONS.values())]
                      ).subquery("given")
    now = db_now()
    # Only the decision that was emitted: one made again meanwhile has another time.
    marks = {emitted.key: sa.case((at == given.c[at.key], now), else_=emitted)
             for at, emitted in DECISIONS.values()}
    return sa.update(occurrences).where(occurrences.c.run_id == given.c.run_id).values(
        **marks, emitting_until=sa.null())


_MARK_EMITTED = Statement(
    "mark_decision_events_emitted", "The given decisions' events were handed to the Prefect "
    "server: each is recorded emitted (if it is still the decision made then), and the lease is "
    "given back.", _mark_emitted)

_RUN_STATES = Statement(
    "read_run_states", "Where each Run of a job stands from a period on (no documents), with "
    "whether its lease expired by the database clock; revision 0 only, what the job owes "
    "(a revision is an operator's, resumed by its own revise flow run).",
    lambda d: sa.select(
        runs.c.run_id, runs.c.subject, runs.c.period_start, runs.c.version, runs.c.status,
        runs.c.attempts, runs.c.model_calls, runs.c.updated_at, runs.c.error,
        sa.func.coalesce(runs.c.lease_expires_at <= db_now(), sa.false()).label("lease_expired"),
    ).where(runs.c.job == param(runs.c.job),
            runs.c.period_start >= param(runs.c.period_start, "since"), runs.c.revision == 0)
    .order_by(runs.c.period_start, runs.c.subject))
_OCCURRENCES = Statement(
    "read_occurrences", "The decisions and alerts about a job's occurrences from a period on.",
    lambda d: sa.select(occurrences)
    .where(occurrences.c.job == param(occurrences.c.job),
           occurrences.c.period_start >= param(occurrences.c.period_start, "since"))
    .order_by(occurrences.c.period_start, occurrences.c.subject))


def _rows(d: str, identities: Sequence[RunIdentity], **extra: Any) -> list[dict[str, Any]]:
    return [{"run_id": i.run_id, "job": i.job, "subject": i.subject,
             "period_start": json_timestamp(d, i.period_start), "version": i.version, **extra}
            for i in identities]


# --- transitions ----------------------------------------------------------------------------


@transition(one_statement_on=EVERYWHERE)
def owe_txn(conn: Connection, job: str, owed_from: Mapping[str, datetime]) -> dict[str, datetime]:
    """Record from which period ``job`` owes each subject not recorded yet; return every
    recorded subject of the job with its period (the first writer's value stays)."""
    d = conn.dialect.name
    given = [{"job": job, "subject": s, "owed_from": json_timestamp(d, start)}
             for s, start in owed_from.items()]
    if given:
        _OWE.rows(conn, owed=given)
    return read_obligations(conn, job)


@transition(one_statement_on=EVERYWHERE)
def skip_txn(conn: Connection, skipped: Sequence[tuple[RunIdentity, str]]) -> list[str]:
    """Record occurrences skipped by policy (never one with a Run); the run ids newly skipped."""
    if not skipped:
        return []
    d = conn.dialect.name
    given = [{**_rows(d, [identity])[0], "skip_reason": error_text(reason)}
             for identity, reason in skipped]
    return [row["run_id"] for row in _SKIP.rows(conn, occurrences=given)]


@transition(one_statement_on=EVERYWHERE)
def unskip_txn(conn: Connection, run_ids: Sequence[str]) -> list[str]:
    """Clear the skip of occurrences an operator runs on purpose; the run ids it cleared."""
    if not run_ids:
        return []
    return [row["run_id"] for row in _UNSKIP.rows(conn, ids=[{"run_id": r} for r in run_ids])]


@transition(one_statement_on=EVERYWHERE)
def mark_overdue_txn(conn: Connection, identities: Sequence[RunIdentity]) -> list[str]:
    """Report occurrences overdue once each; the run ids reported now (not before)."""
    if not identities:
        return []
    rows = _OVERDUE.rows(conn, occurrences=_rows(conn.dialect.name, identities))
    return [row["run_id"] for row in rows]


@transition(one_statement_on=EVERYWHERE)
def mark_recovered_txn(conn: Connection, job: str) -> list[Occurrence]:
    """Report once each overdue occurrence of ``job`` whose Run has completed since."""
    return [Occurrence.model_construct(**row) for row in _RECOVERED.rows(conn, job=job)]


@transition(one_statement_on=NOWHERE)
def give_up_txn(conn: Connection, run: RunState, max_attempts: int) -> bool:
    """Fail a stranded Run that used up ``max_attempts`` for good and record the give-up on its
    occurrence; False if it is live, finished or still has attempts left (another reconciler,
    or a worker, got there first)."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidInput(f"max_attempts must be a positive integer, got {max_attempts!r}")
    error = GAVE_UP.format(attempts=run.attempts, error=run.error or "no error recorded")
    failed = _GIVE_UP.first(conn, run_id=run.run_id, max_attempts=max_attempts,
                            error=error_text(error))
    if failed is None:
        return False
    _GAVE_UP.rows(conn, occurrences=_rows(conn.dialect.name, [RunIdentity(**failed)]))
    return True


def unemitted(occurrence: Occurrence) -> list[tuple[str, datetime]]:
    """The occurrence's decisions whose events are not known to be emitted, with when each was
    made (which names the event: emitted again, it is the same event)."""
    found = []
    for kind, (at, emitted) in DECISIONS.items():
        decided = getattr(occurrence, at.key)
        if decided is not None and getattr(occurrence, emitted.key) is None:
            found.append((kind, decided))
    return found


@transition(one_statement_on=EVERYWHERE)
def claim_events_txn(conn: Connection, job: str, lease_seconds: float) -> list[Occurrence]:
    """Lease the occurrences of ``job`` with decisions whose events are not known to be emitted
    (this pass's, or a dead pass's), so that one pass at a time emits them."""
    rows = _CLAIM_EVENTS.rows(conn, job=job, lease=check_seconds(lease_seconds, "lease"))
    return [Occurrence.model_construct(**row) for row in rows]


@transition(one_statement_on=EVERYWHERE)
def mark_emitted_txn(conn: Connection, claimed: Sequence[Occurrence]) -> None:
    """Record the events of the claimed occurrences' unemitted decisions as emitted."""
    d = conn.dialect.name
    given = []
    for occurrence in claimed:
        decided = dict(unemitted(occurrence))
        given.append({"run_id": occurrence.run_id, **{
            at.key: json_timestamp(d, decided[kind]) if kind in decided else None
            for kind, (at, _) in DECISIONS.items()}})
    if given:
        _MARK_EMITTED.rows(conn, emitted=given)


# --- reads ----------------------------------------------------------------------------------


def read_obligations(conn: Connection, job: str) -> dict[str, datetime]:
    """Every subject ``job`` owes, with the period it is owed from."""
    return {row["subject"]: row["owed_from"] for row in _OWED.rows(conn, job=job)}


def run_states(conn: Connection, job: str, since: datetime) -> list[RunState]:
    """The job's Runs of periods starting at ``since`` or later, oldest first."""
    return [RunState(**{**row, "lease_expired": bool(row["lease_expired"])})
            for row in _RUN_STATES.rows(conn, job=job, since=since)]


def list_occurrences(conn: Connection, job: str, since: datetime) -> list[Occurrence]:
    """The job's recorded occurrences of periods starting at ``since`` or later."""
    return [Occurrence.model_construct(**row)
            for row in _OCCURRENCES.rows(conn, job=job, since=since)]
