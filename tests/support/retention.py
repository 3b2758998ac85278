"""What the retention tests need besides a ledger seeded in bulk (bench/seeding.py): a checksum
of every ledger table, a writer that keeps registering, claiming and completing Runs while
another thread prunes, and the size of a tombstone as each database stores it."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from store import Ledger, OutboxMessage, RunIdentity
from store.dialect import LEDGER_TABLES
from tests.support.ledger import register_and_claim


def checksum(ledger: Ledger) -> dict[str, tuple[int, str]]:
    """Per ledger table: its row count and a sha256 of its rows in key order."""
    found = {}
    with ledger.engine.connect() as conn:
        for table in (*LEDGER_TABLES, "obligations", "suppressed_counts"):
            digest = hashlib.sha256()
            rows = conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1, 2")).all()
            for row in rows:
                digest.update(repr(tuple(row)).encode())
            found[table] = (len(rows), digest.hexdigest())
    return found


@dataclass
class Writer:
    """A thread with a ledger of its own doing register+claim, save input and complete cycles
    (with one outbox message each) until stopped; it counts cycles and keeps its errors."""

    url: str
    job: str = "writer"
    cycles: int = 0
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    advanced: threading.Condition = field(default_factory=threading.Condition)

    def run(self) -> None:
        with Ledger.connect(self.url) as ledger:
            period = datetime(2026, 1, 1, tzinfo=UTC)
            while not self.stop.is_set():
                try:
                    identity = RunIdentity(self.job, f"w{self.cycles}", period, "1")
                    found = register_and_claim(ledger, identity, {}, owner="writer", lease=30)
                    assert found.claim is not None, found
                    ledger.save_input(found.claim, {"text": "x" * 200})
                    ledger.complete(found.claim, {"text": "y" * 100},
                                    [OutboxMessage("w@example.com", "w", "body")])
                except BaseException as exc:  # every failure is the test's news
                    self.errors.append(exc)
                    return
                with self.advanced:
                    self.cycles += 1
                    self.advanced.notify_all()

    def one_more(self, timeout: float = 60.0) -> None:
        """Wait until the writer completes one more cycle (the pruner's hook between two
        batches: a writer that cannot write between batches fails the test here)."""
        with self.advanced:
            target = self.cycles + 1
            if not self.advanced.wait_for(lambda: self.cycles >= target or bool(self.errors),
                                          timeout):
                raise AssertionError(f"the writer completed no cycle in {timeout} s")


def tombstone_bytes(ledger: Ledger) -> tuple[float, float]:
    """The average tombstone row as stored (PostgreSQL: ``pg_column_size`` of the row;
    SQLite: its values' stored lengths), and the runs table with its indexes per Run (after
    pruning: PostgreSQL after VACUUM, SQLite from ``dbstat``)."""
    with ledger.engine.connect() as conn:
        if ledger.dialect == "postgresql":
            row = conn.exec_driver_sql(
                "SELECT avg(pg_column_size(r.*)) FROM runs r WHERE pruned_at IS NOT NULL"
            ).scalar_one()
            table = conn.exec_driver_sql(
                "SELECT pg_total_relation_size('runs') / count(*)::float FROM runs").scalar_one()
            return float(row), float(table)
        columns = [c["name"] for c in sa.inspect(conn).get_columns("runs")]
        sizes = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in columns)
        row = conn.exec_driver_sql(
            f"SELECT avg({sizes}) FROM runs WHERE pruned_at IS NOT NULL").scalar_one()
        table = conn.exec_driver_sql(
            "SELECT sum(pgsize) * 1.0 / (SELECT count(*) FROM runs) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = 'runs')").scalar_one()
        return float(row), float(table)
