"""Helpers for the ledger tests: a snapshot of every Run table, and a wait on the database
clock."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store import Ledger
from store.models import attempts_table, outbox_table, runs_table


def snapshot(ledger: Ledger) -> dict[str, list[dict[str, Any]]]:
    """Every row of the ledger's Run tables, to prove a refused call wrote nothing."""
    with ledger.engine.connect() as conn:
        return {
            table.name: [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(*table.primary_key))]
            for table in (runs_table, attempts_table, outbox_table)
        }


def wait_for_db_clock(ledger: Ledger, instant: datetime) -> None:
    """Sleep until the DATABASE clock has passed ``instant`` (lease expiry is judged by it)."""
    deadline = time.monotonic() + 30
    while ledger.database.now() <= instant:
        assert time.monotonic() < deadline, "the database clock did not advance"
        time.sleep(0.05)
