"""A ledger that stays locked by another writer is a clear, retryable LedgerBusy error that wrote
nothing, never a win: SQLite's single write lock (bounded retries), and on PostgreSQL a Run row or
table held by a transaction that does not end (the lock timeout). A lock released in time is
simply waited out. (PostgreSQL's ordinary row contention is covered by the drills.)"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from store import OutboxMessage, RunIdentity, RunledgerError
from store.database import Busy, Database
from store.errors import LedgerBusy
from store.ledger import Ledger
from tests.support.ledger import register_and_claim

IDENTITY = RunIdentity("digest", "team-a", datetime(2026, 11, 29, tzinfo=UTC), "v1")


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    ledger = Ledger.connect(f"sqlite:///{path}")
    ledger.migrate()
    ledger.close()
    return path


@pytest.fixture
def impatient(sqlite_path: Path) -> Iterator[Ledger]:
    """A ledger that waits 50 ms for the write lock and tries three times."""
    ledger = Ledger.connect(f"sqlite:///{sqlite_path}", busy_timeout_ms=50, locked_retries=2)
    yield ledger
    ledger.close()


def lock(path: Path) -> sqlite3.Connection:
    """Another connection holding SQLite's write lock."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_a_ledger_locked_by_another_writer_raises_ledger_busy_and_writes_nothing(
    sqlite_path: Path, impatient: Ledger
) -> None:
    """While another connection holds the write lock, register and claim fail with LedgerBusy
    after the bounded retries; nothing is written and the error says it is retryable."""
    run = impatient.register(IDENTITY)
    holder = lock(sqlite_path)
    try:
        with pytest.raises(LedgerBusy, match="stayed locked after 3 tries of 50 ms") as busy:
            impatient.claim(run.run_id, "worker-1:101", 60)
        with pytest.raises(LedgerBusy):
            impatient.register(RunIdentity("digest", "team-b", IDENTITY.period_start, "v1"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert isinstance(busy.value, RunledgerError) and busy.value.retryable
    stored = impatient.get(run.run_id)
    assert (stored.status, stored.fence, impatient.attempts(run.run_id)) == ("pending", 0, [])
    assert len(impatient.runs()) == 1


def test_a_lock_released_within_the_retries_is_waited_out(sqlite_path: Path) -> None:
    """A short lock only delays the write: the claim succeeds once the other writer commits."""
    def hold_write_lock(_run_id: str) -> Callable[[], None]:
        holder = lock(sqlite_path)

        def release() -> None:
            holder.execute("ROLLBACK")
            holder.close()
        return release

    ledger = Ledger.connect(f"sqlite:///{sqlite_path}", busy_timeout_ms=50, locked_retries=8)
    try:
        assert_a_short_lock_only_delays_the_claim(ledger, hold_write_lock)
    finally:
        ledger.close()


def assert_a_short_lock_only_delays_the_claim(
        ledger: Ledger, hold_lock: Callable[[str], Callable[[], None]]) -> None:
    """``hold_lock(run_id)`` locks the Run's database or row and returns its release."""
    run = ledger.register(IDENTITY)
    release = threading.Timer(0.3, hold_lock(run.run_id))
    release.start()
    claim = ledger.claim(run.run_id, "worker-1:101", 60)
    release.join()
    assert claim is not None and claim.fence == 1


# --- Writers of one process ----------------------------------------------------------------


def test_threads_of_one_process_writing_at_once_never_find_the_ledger_locked(db_url: str) -> None:
    """Eight threads register, claim, store input and complete 25 Runs each at the same time
    on a ledger that gives up at the first "database is locked" (no busy wait, no retry):
    every write goes through, because the process's writers take turns before they reach
    SQLite's lock (on PostgreSQL they lock different rows)."""
    ledger = Ledger.connect(db_url, busy_timeout_ms=0, locked_retries=0)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def write(thread: int) -> None:
        try:
            start.wait()
            for i in range(25):
                identity = RunIdentity("digest", f"t{thread}-s{i}", IDENTITY.period_start, "v1")
                registration = register_and_claim(ledger, identity, owner=f"w{thread}:1", lease=60)
                assert registration.claim is not None
                ledger.save_input(registration.claim, {"i": i})
                ledger.complete(registration.claim, {"summary": f"{thread}-{i}"},
                                [OutboxMessage("a@example.com", "s", "b")])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        done = ledger.runs(status="completed", limit=1000)
        assert len(done) == 200 and len(ledger.outbox.messages(limit=1000)) == 200
    finally:
        ledger.close()


def test_a_thread_that_keeps_writing_makes_the_other_writers_of_its_process_busy_not_stuck(
    sqlite_path: Path
) -> None:
    """While one thread's completion stays open (its effect blocks), another thread of the
    same process waits its turn no longer than ``turn_seconds``, then gets a retryable
    LedgerBusy naming the cause; nothing of its write is stored, and it goes through once the
    first thread is done."""
    impatient = Ledger(Database(f"sqlite:///{sqlite_path}", Busy(50, 2, turn_seconds=0.2)))
    try:
        run = impatient.register(IDENTITY)
        claim = impatient.claim(run.run_id, "worker-1:101", 60)
        assert claim is not None
        inside, leave = threading.Event(), threading.Event()

        def effect(_session: Any, _output: dict[str, Any]) -> None:
            inside.set()
            leave.wait(30)

        completing = threading.Thread(target=impatient.complete, args=(claim, {"summary": "s"}),
                                      kwargs={"effect": effect})
        other = RunIdentity("digest", "team-b", IDENTITY.period_start, "v1")
        completing.start()
        try:
            assert inside.wait(30)
            with pytest.raises(LedgerBusy, match=r"another thread of this process kept writing to "
                                                 r"the SQLite ledger for 0\.2 s") as busy:
                impatient.register(other)
            assert busy.value.retryable
            assert [r.subject for r in impatient.runs()] == ["team-a"]
        finally:
            leave.set()
            completing.join()
        assert impatient.get(run.run_id).status == "completed"
        assert impatient.register(other).status == "pending"
    finally:
        impatient.close()


# --- PostgreSQL: the lock timeout ----------------------------------------------------------


@pytest.fixture
def pg_url(postgres_databases: Any) -> Iterator[str]:
    url = postgres_databases.create()
    yield url
    postgres_databases.drop(url)


@pytest.fixture
def hold(postgres_databases: Any, pg_url: str) -> Callable[[str], psycopg.Connection[Any]]:
    """Another session on ``pg_url`` that takes a lock with a statement and keeps it."""
    return lambda statement: postgres_databases.hold(pg_url, statement)


def test_a_postgres_run_row_held_by_an_open_transaction_makes_writes_ledger_busy_after_the_lock_timeout(
    pg_url: str, hold: Callable[[str], psycopg.Connection[Any]],
) -> None:
    """A transaction that holds a Run's row and never ends (a stuck effect, an operator's
    session) does not hang the workers: claim, save_input, complete and fail wait the lock
    timeout, then raise LedgerBusy naming it; nothing is written; once the row is free the
    holder's save_input and complete go through."""
    ledger = Ledger.connect(pg_url, lock_timeout_ms=150)
    try:
        run = ledger.register(IDENTITY)
        claim = ledger.claim(run.run_id, "worker-1:101", 60)
        assert claim is not None
        holder = hold(f"SELECT 1 FROM runs WHERE run_id = '{run.run_id}' FOR UPDATE")
        try:
            for call in (
                lambda: ledger.claim(run.run_id, "worker-1:101", 60),
                lambda: ledger.save_input(claim, {"docs": ["a"]}),
                lambda: ledger.complete(claim, {"summary": "s"}, [OutboxMessage("a@example.com", "s", "b")]),
                lambda: ledger.fail(claim, "boom", retryable=True),
            ):
                with pytest.raises(LedgerBusy, match=r"lock timeout \(150 ms, RUNLEDGER_POSTGRES_LOCK_TIMEOUT_MS\)") as busy:
                    call()
                assert busy.value.retryable
            stored = ledger.get(run.run_id)
            assert (stored.status, stored.fence, stored.raw_input, stored.output) == ("running", 1, None, None)
            assert len(ledger.attempts(run.run_id)) == 1 and ledger.outbox.messages(run_id=run.run_id) == []
        finally:
            holder.rollback()
            holder.close()
        assert ledger.save_input(claim, {"docs": ["a"]}) == {"docs": ["a"]}
        assert ledger.complete(claim, {"summary": "s"}).run.status == "completed"
    finally:
        ledger.close()


def test_a_postgres_table_locked_by_ddl_makes_register_and_claim_ledger_busy_and_reads_still_answer(
    pg_url: str, hold: Callable[[str], psycopg.Connection[Any]],
) -> None:
    """An operator's migration holding the runs table: register+claim of a new Run gives up
    after the lock timeout with LedgerBusy and inserts nothing."""
    ledger = Ledger.connect(pg_url, lock_timeout_ms=100)
    try:
        holder = hold("LOCK TABLE runs IN EXCLUSIVE MODE")
        try:
            with pytest.raises(LedgerBusy, match="100 ms"):
                register_and_claim(ledger, IDENTITY, {"recipients": ["a@example.com"]},
                                   owner="worker-1:101", lease=60)
            assert ledger.runs() == []  # EXCLUSIVE lets reads through
        finally:
            holder.rollback()
            holder.close()
        registration = register_and_claim(ledger, IDENTITY, {"recipients": ["a@example.com"]},
                                          owner="worker-1:101", lease=60)
        assert registration.claim is not None and registration.claim.fence == 1
    finally:
        ledger.close()


def test_a_postgres_lock_released_within_the_lock_timeout_is_waited_out(
        pg_url: str, hold: Callable[[str], psycopg.Connection[Any]]) -> None:
    """A short transaction on the Run only delays the claim."""
    def hold_row(run_id: str) -> Callable[[], None]:
        holder = hold(f"SELECT 1 FROM runs WHERE run_id = '{run_id}' FOR UPDATE")

        def release() -> None:
            holder.rollback()
            holder.close()
        return release

    ledger = Ledger.connect(pg_url, lock_timeout_ms=5_000)
    try:
        assert_a_short_lock_only_delays_the_claim(ledger, hold_row)
    finally:
        ledger.close()
