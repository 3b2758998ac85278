"""Helpers for the ledger tests: one Run registered and claimed, a snapshot of every Run table,
a wait on the database clock, and another session holding the write lock."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa

from store import Claim, Ledger, Registration, RunIdentity
from store.call_tables import model_calls_table
from store.models import attempts_table, outbox_table, runs_table


def register_and_claim(ledger: Ledger, identity: RunIdentity, params: dict[str, Any] | None = None,
                       *, owner: str, lease: timedelta | float) -> Registration:
    """Register one Run and take its lease, as a tick does for all of its Runs at once
    (``Ledger.register_and_claim_many``); ``RunConflict`` if it exists with other parameters."""
    found = ledger.register_and_claim_many([(identity, params)], owner=owner, lease=lease)
    registration = found[identity.run_id]
    if registration.conflict is not None:
        raise registration.conflict
    return registration


def claim_of(ledger: Ledger, identity: RunIdentity, *, owner: str = "w:1",
             lease: timedelta | float = timedelta(minutes=15)) -> Claim:
    """The lease on a new Run ``identity``, taken by ``owner``."""
    claim = register_and_claim(ledger, identity, owner=owner, lease=lease).claim
    assert claim is not None, f"Run {identity.run_id} was not claimed"
    return claim


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


def model_calls(ledger: Ledger) -> list[dict[str, Any]]:
    """Every model call the ledger recorded (each one that left a process), oldest first, with
    its Run's subject and the pid of the worker whose Attempt made it (owner host:pid:...;
    None once retention deleted the Attempt, the call's record stays)."""
    calls, attempts, runs = model_calls_table, attempts_table, runs_table
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            sa.select(calls, attempts.c.owner, runs.c.subject)
            .outerjoin(attempts, attempts.c.attempt_id == calls.c.attempt_id)
            .join(runs, runs.c.run_id == calls.c.run_id)
            .order_by(calls.c.started_at, calls.c.call_id)).all()
    return [{**row._mapping, "pid": int(row.owner.split(":")[1]) if row.owner else None}
            for row in rows]


@contextmanager
def write_locked(db_url: str) -> Iterator[None]:
    """Another session holding the ledger's write lock (SQLite's database lock, an EXCLUSIVE
    lock on PostgreSQL's runs table) until the block ends: reads go on, every write waits."""
    url = sa.engine.make_url(db_url)
    if url.get_backend_name() == "sqlite":
        lite = sqlite3.connect(str(url.database), isolation_level=None, check_same_thread=False)
        try:
            lite.execute("BEGIN IMMEDIATE")
            yield
            lite.execute("ROLLBACK")
        finally:
            lite.close()
        return
    with psycopg.connect(url.set(drivername="postgresql").render_as_string(False)) as pg:
        pg.execute("LOCK TABLE runs IN EXCLUSIVE MODE")
        yield
        pg.rollback()
