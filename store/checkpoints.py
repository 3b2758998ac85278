"""Checkpoints: the answer of a model call, stored on its record when it arrived (fenced, in
the commit that records it answered), handed to a later attempt of the Run instead of calling
again: by its position in the transform and its prompt's digest, and never once validation
rejected the candidate it made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.call_tables import model_calls_table
from store.dialect import db_now
from store.fence import RUN_LEASE, run_held
from store.lease import Claim
from store.models import runs_table
from store.statement import EVERYWHERE, Statement, param, transition

calls = model_calls_table
runs = runs_table


@dataclass(frozen=True)
class Checkpoint:
    """An answer recorded for a position of a Run's transform, handed to a later attempt."""

    call_id: str
    answer: dict[str, Any]


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
        .where(calls.c.call_id == latest, run_held())
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
           calls.c.rejected_at.is_(None), run_held())
    .values(rejected_at=db_now())
    .returning(calls.c.call_id))



@transition(one_statement_on=EVERYWHERE)
def replay_txn(conn: Connection, claim: Claim, position: int,
               prompt_digest: str) -> Checkpoint | None:
    """The checkpointed answer of this position of the Run's transform for a prompt with the
    same digest, counted as reused; None when there is none (or the lease is no longer held)."""
    row = _REPLAY.first(conn, **RUN_LEASE.presented(claim.run_id, claim.fence, claim.owner),
                        position=position, prompt_digest=prompt_digest)
    return Checkpoint(row["call_id"], row["answer"]) if row else None


@transition(one_statement_on=EVERYWHERE)
def reject_answers_txn(conn: Connection, claim: Claim) -> list[str]:
    """Validation rejected the Run's candidate: its checkpointed answers are kept as evidence
    and never replayed; only the holder of the Run's lease can say so."""
    given = RUN_LEASE.presented(claim.run_id, claim.fence, claim.owner)
    return [row["call_id"] for row in _REJECT.rows(conn, **given)]
