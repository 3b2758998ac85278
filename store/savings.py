"""Savings: what the duplicate Runs a tick suppressed would have cost had they run again,
counted per job, UTC day and currency from their answered model calls."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.call_tables import model_calls_table, suppressed_costs_table
from store.dialect import db_now, json_rows, upsert
from store.statement import EVERYWHERE, Statement, insert_rows, param, transition

calls = model_calls_table
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
    insert = insert_rows(upsert(d, saved),
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
