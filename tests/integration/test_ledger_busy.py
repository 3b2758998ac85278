"""SQLite's single writer: a ledger that stays locked by another writer is a clear, retryable
LedgerBusy error and never a win; a lock released within the retries is simply waited out.
(PostgreSQL has row locks instead of a database lock; its contention is covered by the drills.)"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from store import LedgerBusy, RunIdentity, RunledgerError
from store.ledger import Ledger

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
    stored = impatient.require(run.run_id)
    assert (stored.status, stored.fence, impatient.attempts(run.run_id)) == ("pending", 0, [])
    assert len(impatient.runs()) == 1


def test_a_lock_released_within_the_retries_is_waited_out(sqlite_path: Path) -> None:
    """A short lock only delays the write: the claim succeeds once the other writer commits."""
    ledger = Ledger.connect(f"sqlite:///{sqlite_path}", busy_timeout_ms=50, locked_retries=8)
    try:
        run = ledger.register(IDENTITY)
        holder = lock(sqlite_path)
        release = threading.Timer(0.3, lambda: holder.execute("ROLLBACK"))
        release.start()
        claim = ledger.claim(run.run_id, "worker-1:101", 60)
        release.join()
        holder.close()
        assert claim is not None and claim.fence == 1
    finally:
        ledger.close()
