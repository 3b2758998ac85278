"""A large ledger seeded fast with bulk SQL (PostgreSQL: generate_series; SQLite: a recursive
CTE), a checksum of every ledger table, a writer that keeps registering, claiming and
completing Runs while another thread prunes, and the size of a tombstone as each database
stores it."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from store import Ledger, OutboxMessage, RunIdentity
from store.dialect import LEDGER_TABLES

FAILED_EVERY = 101  # every 101st seeded Run failed (awaits an operator: never pruned)
PENDING_EVERY = 103  # every 103rd pending (not finished: never pruned)
UNSENT_EVERY = 97  # every 97th completed Run's message still to deliver (its Run skipped)
DEAD_EVERY = 89  # every 89th message dead (final: pruned with its Run)
UNSENT = ("pending", "sending", "retry", "uncertain")


def _status(n: str) -> str:
    return (f"CASE WHEN {n} % {FAILED_EVERY} = 0 THEN 'failed' "
            f"WHEN {n} % {PENDING_EVERY} = 0 THEN 'pending' ELSE 'completed' END")


def _completed(n: str) -> str:
    return f"{n} % {FAILED_EVERY} <> 0 AND {n} % {PENDING_EVERY} <> 0"


def _message_status(n: str) -> str:
    unsent = " ".join(f"WHEN {i} THEN '{s}'" for i, s in enumerate(UNSENT))
    return (f"CASE WHEN {n} % {UNSENT_EVERY} = 0 THEN CASE ({n} / {UNSENT_EVERY}) % 4 {unsent} "
            f"END WHEN {n} % {DEAD_EVERY} = 0 THEN 'dead' ELSE 'sent' END")


@dataclass(frozen=True)
class Seeded:
    """What ``seed`` wrote: how many Runs of each kind, and the messages left to deliver."""

    runs: int
    completed: int
    failed: int
    pending: int
    unsent: int  # completed Runs with a message still to deliver


def expected(n: int) -> Seeded:
    numbers = range(1, n + 1)
    failed = sum(1 for i in numbers if i % FAILED_EVERY == 0)
    pending = sum(1 for i in numbers if i % FAILED_EVERY and i % PENDING_EVERY == 0)
    unsent = sum(1 for i in numbers if i % FAILED_EVERY and i % PENDING_EVERY
                 and i % UNSENT_EVERY == 0)
    return Seeded(n, n - failed - pending, failed, pending, unsent)


def seed(ledger: Ledger, job: str, n: int, at: datetime) -> Seeded:
    """``n`` Runs of ``job`` created and finished at ``at``, each with about 1.4 kB of raw
    input and output, one Attempt; each completed one with one outbox message (most sent, some
    dead, some still to deliver) and one delivery attempt when it was tried."""
    pg = ledger.dialect == "postgresql"
    if pg:
        numbers = f"FROM generate_series(1, {int(n)}) AS seq(n)"
        prefix, text = "", "repeat('{c}', {k})"
        run_id, json_ = "lpad(to_hex(n), 64, '0')", "::jsonb"
        when = "CAST(:at AS timestamptz)"
    else:
        numbers = "FROM seq"
        prefix = f"WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < {int(n)}) "
        text = "replace(hex(zeroblob({k})), '00', '{c}')"
        run_id, json_ = "printf('%064x', n)", ""
        when = ":at"

    def doc(c: str, k: int) -> str:
        return f"""('{{"text": "' || {text.format(c=c, k=k)} || '"}}'){json_}"""

    at_value: object = at if pg else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    statements = [
        f"""{prefix}INSERT INTO runs (run_id, job, subject, period_start, version,
            params_fingerprint, params, status, fence, attempts, raw_input, output, error,
            completed_attempt_id, model_calls, created_at, updated_at, completed_at)
        SELECT {run_id}, :job, 's' || n, {when}, '1', :fingerprint,
            ('{{"recipients": ["a@example.com"]}}'){json_}, {_status('n')}, 1, 1,
            {doc('x', 1000)}, {doc('y', 400)},
            CASE WHEN {_status('n')} = 'failed' THEN 'boom' END,
            'a' || substr({run_id}, 30), 1, {when}, {when},
            CASE WHEN {_status('n')} = 'completed' THEN {when} END
        {numbers}""",
        """INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at, finished_at,
            outcome, model_calls)
        SELECT 'a' || substr(run_id, 30), run_id, 'seed', 1, created_at, created_at,
            CASE status WHEN 'completed' THEN 'completed' WHEN 'failed' THEN 'failed'
            ELSE 'released' END, 1
        FROM runs WHERE job = :job""",
        f"""{prefix}INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body,
            headers, status, attempts, fence, created_at, updated_at, sent_at)
        SELECT 'm' || substr({run_id}, 2), {run_id}, 'email', 'a@example.com', 'seeded',
            {text.format(c='b', k=300)}, ('{{}}'){json_}, {_message_status('n')}, 1, 1,
            {when}, {when}, {when}
        {numbers} WHERE {_completed('n')}""",
        """INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, finished_at,
            outcome, reply_code)
        SELECT message_id, 1, 'seed', created_at, created_at, status, 250
        FROM outbox WHERE status IN ('sent', 'dead', 'retry', 'uncertain')
            AND run_id IN (SELECT run_id FROM runs WHERE job = :job)""",
    ]
    with ledger.engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement), {"job": job, "at": at_value,
                                              "fingerprint": "f" * 64})
    return expected(n)


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
                    found = ledger.register_and_claim(identity, {}, owner="writer", lease=30)
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


def old(ledger: Ledger, days: int = 400) -> datetime:
    """A completion time ``days`` before the database clock: older than any retention used."""
    return ledger.now() - timedelta(days=days)
