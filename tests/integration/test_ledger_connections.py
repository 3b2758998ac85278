"""A process's ledger keeps a bounded set of connections: more threads than that take turns
instead of stalling in the pool behind it, and the pool keeps room for reads and tools."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy.engine import Connection

from flows.errors import is_transient
from flows.ports import free_port
from store.database import IDLE_PING_SECONDS, KEPT_CONNECTIONS
from store.errors import LedgerBusy, LedgerUnavailable
from store.ledger import Ledger
from tests.support.waiting import wait_until


class Occupancy:
    """Work that holds its connection until released, counting how many are held at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = 0
        self.peak = 0
        self.release = threading.Event()

    def __call__(self, conn: Connection) -> int:
        with self.lock:
            self.held += 1
            self.peak = max(self.peak, self.held)
        try:
            self.release.wait(10)
            return int(conn.exec_driver_sql("SELECT 1").scalar_one())
        finally:
            with self.lock:
                self.held -= 1


def write(ledger: Ledger, work: Any) -> Any:
    """A write through the kept connections of the ledger's transactional engine: on SQLite
    as one statement, which takes no lock before it runs (a BEGIN IMMEDIATE would hold the
    database against the tool's checkout below)."""
    return ledger.database.write(work, single_statement=ledger.dialect == "sqlite")


def test_more_threads_than_kept_connections_take_turns_and_the_pool_keeps_room_for_reads(
        ledger: Ledger) -> None:
    """Eight more writers than the ledger keeps connections (and more than its pool holds):
    no more than the limit are held at once (on SQLite one: a process's writers of one file
    take turns), the rest wait for one to come back, a tool's checkout from the same pool still
    gets a connection meanwhile, and every write succeeds."""
    work = Occupancy()
    threads = KEPT_CONNECTIONS + 8
    limit = 1 if ledger.dialect == "sqlite" else KEPT_CONNECTIONS
    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(write, ledger, work) for _ in range(threads)]
        wait_until(lambda: work.held >= limit, 20, "every connection writers may hold in use",
                   every=0.01)
        time.sleep(0.2)  # time for a writer beyond the limit to get in, were it let in
        assert work.held == limit
        with ledger.engine.connect() as conn:  # as a migration or an operator tool does
            assert conn.exec_driver_sql("SELECT 2").scalar_one() == 2
        assert work.held == limit
        work.release.set()
        assert [f.result(timeout=60) for f in futures] == [1] * threads
    assert work.peak == limit


# A SQLite writer waits for its turn before it takes a connection, and only one writer of a
# process has its turn: the bound on that wait is tested in test_ledger_busy.py.
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_writer_that_finds_every_kept_connection_busy_too_long_gets_ledger_busy(
        ledger: Ledger) -> None:
    """The wait for a kept connection is bounded: a retryable LedgerBusy naming the limit."""
    kept = ledger.database.transactional
    kept.limit, kept.wait_seconds = 1, 0.2
    work = Occupancy()
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(write, ledger, work)
        wait_until(lambda: work.held == 1, 20, "the only kept connection in use", every=0.01)
        with pytest.raises(LedgerBusy, match="all 1 ledger connections of this process"):
            write(ledger, work)
        work.release.set()
        assert holding.result(timeout=20) == 1
    assert write(ledger, lambda conn: 2) == 2


# Only server connections are pinged: SQLite's are files of this process.
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_an_idle_kept_connection_that_fails_its_ping_is_replaced_and_frees_its_place(
        ledger: Ledger) -> None:
    """A kept connection idle past the ping interval that can no longer run the ping (here
    closed, which SQLAlchemy reports as its own error, not the driver's) is discarded and the
    read gets a new one; the limit still counts one connection."""
    kept = ledger.database.autocommit
    assert kept is not None and kept.ping
    assert ledger.get_many(["no-such-run"]) == {}  # opens the first kept connection
    assert kept.opened == 1
    [(conn, _)] = kept._idle
    conn.close()
    kept._idle[:] = [(conn, time.monotonic() - IDLE_PING_SECONDS - 1)]
    assert ledger.get_many(["no-such-run"]) == {}
    assert kept.opened == 1
    [(replacement, _)] = kept._idle
    assert replacement is not conn


def test_migrating_while_the_server_is_down_raises_a_retryable_ledger_error() -> None:
    """`migrate` (run by `runledger run` as it starts) against a PostgreSQL port where nothing
    listens raises LedgerUnavailable, which retries classify as transient, not the driver's
    OperationalError (found by drill 3: a restart as a worker started)."""
    ledger = Ledger.connect(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres")
    try:
        with pytest.raises(LedgerUnavailable) as raised:
            ledger.migrate()
    finally:
        ledger.close()
    assert is_transient(raised.value)
