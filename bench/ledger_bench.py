"""Ledger throughput against the hand-written procedure a team writes first, measured in the
same run.

For each dialect (PostgreSQL, then SQLite in one WAL file), on fresh databases dropped
afterwards, N worker processes (default 8) run, all starting each phase together at a barrier:

1. baseline (PostgreSQL): the textbook hand-written procedure, through raw psycopg 3 on its
   own ``runs`` and ``notification_outbox`` tables in a database of its own: register (``INSERT
   ... ON CONFLICT``), claim (``UPDATE`` with a lease), raw input (``UPDATE ... COALESCE``), then
   the completion ``UPDATE`` guarded by ``lock_owner`` and the outbox ``INSERT ... ON CONFLICT``
   in one transaction, on distinct keys;
2. ledger: full Run cycles on distinct keys: ``Ledger.register_and_claim_many``, ``save_input``,
   ``complete`` with one outbox row (4 ledger transitions, with the fence, the Attempt and the
   parameters check the baseline lacks);
3. the same cycle with ``register`` and ``claim`` as two calls;
4. (PostgreSQL) replay: the exact statements of one ledger cycle, recorded from the driver once,
   replayed through raw psycopg with fresh identifiers and no runledger code around them: the
   ceiling any client code could reach with these statements.

The phases alternate in slices (each in turn, then again) so that a noisy neighbour on a shared
machine hurts all alike. Each process reports its own CPU time (``os.times``) over its timed
loop: client CPU per Run is their sum over the Runs they completed.

On PostgreSQL, then:

5. per Run: one process runs ``--account-runs`` cycles of each procedure through a counting
   loopback proxy (round trips: ReadyForQuery messages; statements: CommandComplete messages,
   BEGIN/COMMIT apart) and reads the WAL they wrote with ``pg_waldump``, keeping only the
   records of the benchmark's databases and their transactions (the server is shared): WAL
   records and bytes, rows written (heap tuples) and index entries per Run. Without access to
   the WAL files it falls back to ``pg_stat_wal``, which counts every database's WAL.
6. one hop away: phases 1, 2 and 4 again with every connection through a proxy process that
   holds each chunk ``--hop-delay`` seconds (default 0.5 ms) each way.
7. contention: the N processes claim the same key at once, ``--rounds`` times: exactly one
   winner per round, and the p50/p99 claim latency.

Usage: uv run python bench/ledger_bench.py [--seconds 10] [--workers 8] [--dialect both]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.types.json import Jsonb

from bench.pgproxy import Proxy, in_process
from store import Claim, Ledger, OutboxMessage, RunIdentity

TARGET_RATIO = 1.0
HOP_TARGET_RATIO = 2.0
SLICES = 4
WARMUP = 20
ADMIN_URL = os.environ.get(
    "RUNLEDGER_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PERIOD = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=900)
LEASE_SECONDS = 900

# The baseline's schema and statements: a run key with a lock owner and a lease, the output
# and the outbox row in one transaction, and nothing else (no fence, no Attempt row).
BASELINE_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    job_name TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    scheduled_at TIMESTAMPTZ NOT NULL,
    version TEXT NOT NULL,
    status TEXT NOT NULL CHECK (
        status IN ('pending', 'running', 'completed', 'failed')
    ),
    raw_input JSONB,
    output JSONB,
    lock_owner TEXT,
    lock_expires_at TIMESTAMPTZ,
    last_error TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    UNIQUE (job_name, subject_id, scheduled_at, version)
);
CREATE TABLE notification_outbox (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    channel TEXT NOT NULL,
    payload JSONB NOT NULL,
    delivered_at TIMESTAMPTZ,
    PRIMARY KEY (run_id, channel)
);
"""
BASELINE_REGISTER = """
INSERT INTO runs (run_id, job_name, subject_id, scheduled_at, version, status)
VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s, 'pending')
ON CONFLICT (run_id) DO UPDATE
SET updated_at = CURRENT_TIMESTAMP
RETURNING status, raw_input, output"""
BASELINE_CLAIM = """
UPDATE runs
SET status = 'running',
    lock_owner = %(worker_id)s,
    lock_expires_at = (CURRENT_TIMESTAMP + (%(lease_seconds)s * INTERVAL '1 second')),
    updated_at = CURRENT_TIMESTAMP
WHERE run_id = %(run_id)s
  AND status <> 'completed'
  AND (lock_owner IS NULL OR lock_expires_at < CURRENT_TIMESTAMP OR lock_owner = %(worker_id)s)
RETURNING run_id, status, raw_input"""
BASELINE_INPUT = """
UPDATE runs
SET raw_input = COALESCE(raw_input, %(raw_input)s::jsonb),
    updated_at = CURRENT_TIMESTAMP
WHERE run_id = %(run_id)s
  AND status <> 'completed'
RETURNING raw_input"""
BASELINE_COMPLETE = """
UPDATE runs
SET status = 'completed',
    output = %(output)s::jsonb,
    lock_owner = NULL,
    lock_expires_at = NULL,
    last_error = NULL,
    updated_at = CURRENT_TIMESTAMP
WHERE run_id = %(run_id)s
  AND status <> 'completed'
  AND lock_owner = %(worker_id)s
RETURNING output"""
BASELINE_OUTBOX = """
INSERT INTO notification_outbox (run_id, channel, payload)
VALUES (%(run_id)s, %(channel)s, %(payload)s::jsonb)
ON CONFLICT (run_id, channel) DO NOTHING"""


def stable_run_id(job_name: str, subject_id: str, scheduled_at: datetime, version: str) -> str:
    """The baseline's run id: a SHA-256 of the logical run's normalised fields."""
    canonical_time = scheduled_at.astimezone(UTC).isoformat(timespec="seconds")
    identity = "|".join([job_name.strip(), subject_id.strip(), canonical_time, version.strip()])
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Target:
    """One benchmark's databases: the ledger URL, how the raw driver reaches it, and (on
    PostgreSQL) the libpq URL of the baseline procedure's own database."""

    dialect: str
    url: str
    raw: str  # libpq URL, or the SQLite file path
    baseline: str = ""

    def via(self, port: int) -> Target:
        """The same databases reached through a proxy on ``port`` (without TLS, which the
        proxy's counting needs to read)."""

        def moved(url: str) -> str:
            parsed = sa.engine.make_url(url).set(host="127.0.0.1", port=port)
            parsed = parsed.update_query_dict({"sslmode": "disable"})
            return parsed.render_as_string(hide_password=False)

        return replace(self, url=moved(self.url), raw=moved(self.raw), baseline=moved(self.baseline))


def _replaced(value: Any, swap: list[tuple[str, str]]) -> Any:
    """``value`` with every recorded identifier replaced by the fresh one, inside JSON too."""
    if isinstance(value, str):
        for old, new in swap:
            value = value.replace(old, new)
        return value
    if isinstance(value, Jsonb):
        return Jsonb(_replaced(value.obj, swap))
    if isinstance(value, dict):
        return {k: _replaced(v, swap) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_replaced(v, swap) for v in value)
    return value


def cpu_seconds() -> float:
    """This process's CPU time so far, user and system."""
    times = os.times()
    return times.user + times.system


# --- the worker processes ---------------------------------------------------------------------


class Worker:
    """One benchmark process: a Ledger and raw driver connections, kept for the whole run."""

    def __init__(self, target: Target, index: int) -> None:
        self.index = index
        self.ledger = Ledger.connect(target.url)
        self.owner = f"bench:{os.getpid()}:{index}"
        self.keys = 0
        self.recipient = f"user{index}@example.com"
        if target.dialect == "postgresql":
            self.pg = psycopg.connect(target.raw, autocommit=True)
            self.baseline = psycopg.connect(target.baseline, autocommit=True)
            self.recorded = self.record_cycle(target)

    def key(self) -> str:
        self.keys += 1  # the pid too: every crew of a run writes to the same databases
        return f"w{self.index}-{os.getpid()}-{self.keys}"

    def baseline_cycle(self) -> None:
        """The baseline procedure for one logical run on a fresh key: 7 round trips."""
        subject = self.key()
        run_id = stable_run_id("bench", subject, PERIOD, "1")
        ids = {"run_id": run_id, "worker_id": self.owner}
        baseline = self.baseline
        status, _, _ = baseline.execute(BASELINE_REGISTER, {
            "run_id": run_id, "job_name": "bench", "subject_id": subject,
            "scheduled_at": PERIOD, "version": "1"}).fetchone()  # type: ignore[misc]
        assert status == "pending", "a fresh key must be new"
        claimed = baseline.execute(BASELINE_CLAIM, {**ids, "lease_seconds": LEASE_SECONDS}).fetchone()
        assert claimed is not None, "a fresh key must be claimable"
        row = baseline.execute(BASELINE_INPUT, {
            "run_id": run_id, "raw_input": json.dumps({"items": [self.index, self.keys]})
        }).fetchone()
        assert row is not None
        raw = row[0]
        with baseline.transaction():
            done = baseline.execute(BASELINE_COMPLETE, {
                **ids, "output": json.dumps({"summary": f"{len(raw['items'])} items"})
            }).fetchone()
            assert done is not None, "the lease holder must be able to complete"
            baseline.execute(BASELINE_OUTBOX, {"run_id": run_id, "channel": "email", "payload": json.dumps(
                {"recipient": self.recipient, "subject": f"digest {subject}", "body": "body"})})

    def cycle(self) -> None:
        """One full Run cycle on a fresh key: 4 ledger transitions in 3 statements."""
        key = self.key()
        run = RunIdentity("bench", key, PERIOD, "1")
        claim = self.ledger.register_and_claim_many(
            [(run, {"recipients": 1})], owner=self.owner, lease=LEASE
        )[run.run_id].claim
        assert claim is not None, "a fresh key must be claimable"
        self.finish(key, claim)

    def separate_cycle(self) -> None:
        """One full Run cycle on a fresh key: 4 ledger transitions in 4 statements."""
        key = self.key()
        run = self.ledger.register(RunIdentity("bench", key, PERIOD, "1"), {"recipients": 1})
        claim = self.ledger.claim(run.run_id, self.owner, LEASE)
        assert claim is not None, "a fresh key must be claimable"
        self.finish(key, claim)

    def record_cycle(self, target: Target) -> list[tuple[str, Any]]:
        """The statements and parameters one ledger cycle sends to psycopg, with this cycle's
        identifiers as placeholders to be replaced per replayed cycle."""
        recorded: list[tuple[str, Any]] = []

        class Recording(psycopg.Cursor[Any]):
            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                recorded.append((query, params))
                return super().execute(query, params, **kwargs)

        ledger = Ledger.connect(target.url)
        assert ledger.database.autocommit is not None
        sa.event.listen(ledger.database.autocommit.engine, "connect",
                        lambda dbapi_conn, _: setattr(dbapi_conn, "cursor_factory", Recording))
        ledger.get_many(["warm-up"])  # connect (and run the dialect's own set-up queries) first
        recorded.clear()
        key = f"w{self.index}-RECORDED-{uuid.uuid4().hex[:8]}"
        run = RunIdentity("bench", key, PERIOD, "1")
        claim = ledger.register_and_claim_many(
            [(run, {"recipients": 1})], owner=self.owner, lease=LEASE
        )[run.run_id].claim
        assert claim is not None
        self.finish(key, claim, ledger)
        cycle = list(recorded)
        [message] = ledger.outbox.messages(run_id=claim.run_id)
        ledger.close()
        self.placeholders = (claim.run_id, claim.attempt_id, message.message_id, key)
        return cycle

    def replay_cycle(self) -> None:
        """The recorded cycle's statements on a fresh key, through raw psycopg."""
        key = self.key()
        fresh = uuid.uuid5(uuid.NAMESPACE_OID, f"{self.owner}/{key}")
        new = (fresh.hex * 2, str(fresh), fresh.hex[::-1] * 2, key)
        swap = list(zip(self.placeholders, new, strict=True))
        for query, params in self.recorded:
            cursor = self.pg.execute(query, _replaced(params, swap), prepare=True)
            if cursor.description is not None:
                cursor.fetchall()

    def finish(self, key: str, claim: Claim, ledger: Ledger | None = None) -> None:
        ledger = ledger or self.ledger
        raw = ledger.save_input(claim, {"items": [self.index, self.keys]})
        ledger.complete(
            claim, {"summary": f"{len(raw['items'])} items"},
            [OutboxMessage(self.recipient, f"digest {key}", "body")],
        )

    def step(self, phase: str) -> Callable[[], None]:
        return {"baseline": self.baseline_cycle, "ledger": self.cycle, "separate": self.separate_cycle,
                "replay": self.replay_cycle}[phase]

    def timed(self, step: Callable[[], None], seconds: float,
              barrier: Barrier) -> tuple[int, float, float]:
        """Runs, elapsed seconds and this process's CPU seconds of one timed slice."""
        for _ in range(WARMUP):
            step()
        barrier.wait()
        count, start, cpu = 0, time.perf_counter(), cpu_seconds()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            step()
            count += 1
        return count, time.perf_counter() - start, cpu_seconds() - cpu

    def contend(self, run_ids: list[str], barrier: Barrier) -> list[tuple[int, bool, float]]:
        results = []
        for round_no, run_id in enumerate(run_ids):
            self.ledger.get(run_id)  # a warm pooled connection, so the race is the claim itself
            barrier.wait()
            start = time.perf_counter()
            won = self.ledger.claim(run_id, self.owner, LEASE) is not None
            results.append((round_no, won, time.perf_counter() - start))
        return results

    def close(self) -> None:
        self.ledger.close()
        for name in ("pg", "baseline"):
            if hasattr(self, name):
                getattr(self, name).close()


def serve(target: Target, index: int, barrier: Barrier, commands: Any, results: Any) -> None:
    """Process body: run each phase the parent sends, report its result."""
    worker = Worker(target, index)
    while (command := commands.get()) is not None:
        phase, argument = command
        try:
            if phase == "contention":
                results.put(worker.contend(argument, barrier))
            else:
                results.put(worker.timed(worker.step(phase), argument, barrier))
        except BaseException as exc:
            barrier.abort()  # the other processes must not wait for this one
            results.put(RuntimeError(f"worker {index}, phase {phase}: {exc!r}"))
            raise
    worker.close()


class Crew:
    """N spawned worker processes driven phase by phase."""

    def __init__(self, target: Target, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(n)
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(n)]
        self.processes = [
            ctx.Process(target=serve, args=(target, i, self.barrier, q, self.results))
            for i, q in enumerate(self.commands)
        ]
        for p in self.processes:
            p.start()

    def run(self, phase: str, argument: Any) -> list[Any]:
        for q in self.commands:
            q.put((phase, argument))
        done = [self.results.get(timeout=900) for _ in self.commands]
        for result in done:
            if isinstance(result, Exception):
                raise result
        return done

    def slices(self, phases: list[str], seconds: float) -> dict[str, Rate]:
        """Each phase for ``seconds`` in total, in SLICES interleaved slices."""
        totals = {phase: Rate() for phase in phases}
        for _ in range(SLICES):
            for phase in phases:
                totals[phase].add(self.run(phase, seconds / SLICES))
        return totals

    def stop(self) -> None:
        for q in self.commands:
            q.put(None)
        for p in self.processes:
            p.join(timeout=60)
            if p.exitcode != 0:
                raise RuntimeError(f"a benchmark worker exited with {p.exitcode}")


@dataclass
class Rate:
    """One phase's totals over its slices: Runs, mean elapsed seconds per slice summed over the
    slices, client CPU seconds of all processes, and the load average after each slice."""

    runs: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    loads: tuple[float, ...] = ()

    def add(self, done: list[tuple[int, float, float]]) -> None:
        self.runs += sum(c for c, _, _ in done)
        self.seconds += statistics.fmean(e for _, e, _ in done)
        self.cpu += sum(c for _, _, c in done)
        self.loads += (os.getloadavg()[0],)

    @property
    def per_second(self) -> float:
        return self.runs / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.cpu / self.runs * 1000

    def line(self) -> str:
        return (f"{self.per_second:,.0f} Runs/s, client CPU {self.cpu_ms:.3f} ms/Run "
                f"(load {min(self.loads):.2f}-{max(self.loads):.2f})")


# --- databases ---------------------------------------------------------------------------------


@contextmanager
def postgres_target() -> Iterator[Target]:
    """A ledger database and the baseline procedure's own database, both dropped afterwards."""
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    names = [f"rlbench_{uuid.uuid4().hex[:10]}", f"rlbench_base_{uuid.uuid4().hex[:8]}"]
    try:
        with admin.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        urls = [sa.engine.make_url(ADMIN_URL).set(database=name) for name in names]
        raw = [url.set(drivername="postgresql").render_as_string(hide_password=False)
               for url in urls]
        target = Target("postgresql", urls[0].render_as_string(hide_password=False), raw[0],
                        raw[1])
        ledger = Ledger.connect(target.url)
        ledger.migrate()
        ledger.close()
        with psycopg.connect(target.baseline, autocommit=True) as conn:
            conn.execute(BASELINE_SCHEMA)
        yield target
    finally:
        with admin.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextmanager
def sqlite_target() -> Iterator[Target]:
    with tempfile.TemporaryDirectory(prefix="rlbench_") as directory:
        path = Path(directory) / "ledger.db"
        target = Target("sqlite", f"sqlite:///{path}", str(path))
        Ledger.connect(target.url).migrate()
        yield target


# --- per-Run accounting ------------------------------------------------------------------------

WALDUMP_LINE = re.compile(
    r"rmgr: (\w+)\s+len \(rec/tot\):\s+(\d+)/\s*(\d+), tx:\s+(\d+), lsn: [0-9A-F/]+, "
    r"prev [0-9A-F/]+, desc: (\S+)(.*)")
REL = re.compile(r"rel \d+/(\d+)/\d+")


@dataclass
class Work:
    """What one procedure's Runs cost, in total over ``runs`` Runs."""

    runs: int
    round_trips: int
    statements: int
    control: int
    wal_records: int
    wal_bytes: int
    wal_bytes_without_images: int | None
    rows: int | None  # heap tuples written (inserted or updated)
    index_entries: int | None
    wal_source: str

    def per_run(self, value: int | None) -> str:
        return "n/a" if value is None else f"{value / self.runs:.1f}"


def waldump(database_oid: int, start: str, end: str, admin: psycopg.Connection[Any]) -> Counter[str] | None:
    """The WAL records between ``start`` and ``end`` that belong to ``database_oid``'s
    relations or to transactions that wrote them (their commits): counts by kind and total
    bytes; None when the WAL files cannot be read here."""
    tool = shutil.which("pg_waldump") or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_waldump"))), None)
    if tool is None:
        return None
    row = admin.execute("SHOW data_directory").fetchone()
    assert row is not None
    wal = Path(row[0]) / "pg_wal"
    try:
        done = subprocess.run([tool, "-p", str(wal), "-s", start, "-e", end],
                              capture_output=True, text=True, timeout=120)
    except OSError:
        return None
    if done.returncode != 0 and not done.stdout:
        return None
    records = [m.groups() for m in map(WALDUMP_LINE.match, done.stdout.splitlines()) if m]
    ours = {tx for _, _, _, tx, _, rest in records
            if tx != "0" and any(int(o) == database_oid for o in REL.findall(rest))}
    counts: Counter[str] = Counter()
    for rmgr, size, total, tx, kind, rest in records:
        if tx in ours or any(int(o) == database_oid for o in REL.findall(rest)):
            counts["records"] += 1
            counts["bytes"] += int(total)
            counts["bytes_without_images"] += int(size)
            if rmgr == "Heap" and kind in {"INSERT", "UPDATE", "HOT_UPDATE"}:
                counts["rows"] += 1
            elif rmgr == "Btree" and kind.startswith("INSERT"):
                counts["index_entries"] += 1
    return counts


def account(target: Target, runs: int) -> dict[str, Work]:
    """Each PostgreSQL procedure's work for ``runs`` Runs, run by one process through a
    counting proxy, one procedure after the other."""
    upstream = sa.engine.make_url(target.raw)
    proxy = Proxy((upstream.host or "127.0.0.1", upstream.port or 5432)).in_thread()
    assert proxy.counts is not None
    worker = Worker(target.via(proxy.port), 99)
    admin = psycopg.connect(target.raw, autocommit=True)
    work: dict[str, Work] = {}
    try:
        for phase, database in (("baseline", target.baseline), ("ledger", target.raw),
                                ("replay", target.raw)):
            with psycopg.connect(database) as conn:
                row = conn.execute("SELECT oid FROM pg_database "
                                   "WHERE datname = current_database()").fetchone()
                assert row is not None
                oid = int(row[0])
            step = worker.step(phase)
            for _ in range(WARMUP):
                step()
            proxy.counts.reset()
            start, wal0 = admin.execute(
                "SELECT pg_current_wal_lsn()::text, (SELECT array[wal_records, wal_bytes] "
                "FROM pg_stat_wal)").fetchone()  # type: ignore[misc]
            for _ in range(runs):
                step()
            end, wal1 = admin.execute(
                "SELECT pg_current_wal_lsn()::text, (SELECT array[wal_records, wal_bytes] "
                "FROM pg_stat_wal)").fetchone()  # type: ignore[misc]
            counts = proxy.counts
            dumped = waldump(oid, start, end, admin)
            if dumped is not None:
                work[phase] = Work(runs, counts.round_trips, counts.statements, counts.control,
                                   dumped["records"], dumped["bytes"],
                                   dumped["bytes_without_images"], dumped["rows"],
                                   dumped["index_entries"], "pg_waldump, this database's records")
            else:
                work[phase] = Work(runs, counts.round_trips, counts.statements, counts.control,
                                   int(wal1[0] - wal0[0]), int(wal1[1] - wal0[1]), None, None, None,
                                   "pg_stat_wal, every database on the server")
    finally:
        worker.close()
        admin.close()
    return work


# --- the benchmark -----------------------------------------------------------------------------


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def verdict(ratio: float, target: float) -> str:
    return "meets" if ratio >= target else "BELOW"


def throughput(target: Target, workers: int, seconds: float, label: str) -> dict[str, Rate]:
    phases = ["baseline", "ledger", "separate", "replay"] if target.dialect == "postgresql" \
        else ["ledger", "separate"]
    if label != "local":
        phases.remove("separate")
    crew = Crew(target, workers)
    try:
        rates = crew.slices(phases, seconds)
    finally:
        crew.stop()
    tag = f"[{target.dialect}]" + ("" if label == "local" else f" [{label}]")
    names = {
        "baseline": "baseline hand-written procedure, raw psycopg (7 round trips)",
        "ledger": "ledger, register_and_claim + save_input + complete with 1 outbox row",
        "separate": "ledger, register + claim as two calls",
        "replay": "the ledger's statements replayed through raw psycopg, no runledger code",
    }
    for phase, rate in rates.items():
        print(f"{tag} {names[phase]}: {rate.line()}", flush=True)
    if "baseline" in rates:
        baseline, ledger = rates["baseline"], rates["ledger"]
        goal = TARGET_RATIO if label == "local" else HOP_TARGET_RATIO
        ratio = ledger.per_second / baseline.per_second
        print(f"{tag} ratio ledger Runs/s : baseline Runs/s = {ratio:.2f} ({verdict(ratio, goal)} the "
              f"{goal} target); client CPU per Run ledger : baseline = "
              f"{ledger.cpu_ms / baseline.cpu_ms:.2f} (target <= 1.0); the ledger reached "
              f"{ledger.per_second / rates['replay'].per_second:.0%} of the replay's Runs/s",
              flush=True)
    return rates


def contention(target: Target, workers: int, rounds: int) -> None:
    ledger = Ledger.connect(target.url)
    run_ids = [ledger.register(RunIdentity("contention", f"key-{r}", PERIOD, "1")).run_id
               for r in range(rounds)]
    ledger.close()
    crew = Crew(target, workers)
    try:
        winners = [0] * rounds
        latencies: list[float] = []
        for results in crew.run("contention", run_ids):
            for round_no, won, latency in results:
                winners[round_no] += won
                latencies.append(latency)
    finally:
        crew.stop()
    single = all(w == 1 for w in winners)
    print(f"[{target.dialect}] contention, {workers} processes x {rounds} rounds on 1 key each: "
          f"{'exactly 1 winner in every round' if single else f'WINNERS PER ROUND {winners}'}; "
          f"claim latency p50 {percentile(latencies, 50) * 1000:.1f} ms, "
          f"p99 {percentile(latencies, 99) * 1000:.1f} ms", flush=True)
    if not single:
        raise SystemExit(f"[{target.dialect}] a contention round did not have exactly one winner")


def print_work(work: dict[str, Work]) -> None:
    source = next(iter(work.values())).wal_source
    print(f"[postgresql] per Run, {next(iter(work.values())).runs} Runs of each by one process "
          f"(round trips and statements from the wire, WAL from {source}):", flush=True)
    print("[postgresql]   procedure | round trips | statements | BEGIN/COMMIT | rows written | "
          "index entries | WAL records | WAL bytes | without full-page images")
    for phase, w in work.items():
        print(f"[postgresql]   {phase:9} | {w.per_run(w.round_trips):>11} | "
              f"{w.per_run(w.statements):>10} | {w.per_run(w.control):>12} | "
              f"{w.per_run(w.rows):>12} | {w.per_run(w.index_entries):>13} | "
              f"{w.per_run(w.wal_records):>11} | {w.per_run(w.wal_bytes):>9} | "
              f"{w.per_run(w.wal_bytes_without_images):>24}", flush=True)


def hop_round_trip(target: Target, port: int) -> tuple[float, float]:
    """Milliseconds of one ``SELECT 1`` round trip, direct and through the delaying proxy."""
    times = []
    for url in (target.raw, target.via(port).raw):
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(20):
                conn.execute("SELECT 1").fetchall()
            start = time.perf_counter()
            for _ in range(200):
                conn.execute("SELECT 1").fetchall()
            times.append((time.perf_counter() - start) / 200 * 1000)
    return times[0], times[1]


def bench(dialect: str, args: argparse.Namespace) -> None:
    with postgres_target() if dialect == "postgresql" else sqlite_target() as target:
        throughput(target, args.workers, args.seconds, "local")
        if dialect == "postgresql":
            print_work(account(target, args.account_runs))
            if args.hop_delay > 0:
                upstream = sa.engine.make_url(target.raw)
                port, process = in_process(
                    (upstream.host or "127.0.0.1", upstream.port or 5432), args.hop_delay)
                try:
                    direct, hop = hop_round_trip(target, port)
                    label = f"one hop away, +{args.hop_delay * 1000:g} ms each way"
                    print(f"[postgresql] [{label}] SELECT 1 round trip {hop:.2f} ms through the "
                          f"proxy, {direct:.2f} ms direct", flush=True)
                    throughput(target.via(port), args.workers, args.seconds, label)
                finally:
                    process.terminate()
                    process.join()
        contention(target, args.workers, args.rounds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per phase")
    parser.add_argument("--workers", type=int, default=8, help="worker processes")
    parser.add_argument("--rounds", type=int, default=50, help="single-key contention rounds")
    parser.add_argument("--account-runs", type=int, default=200,
                        help="Runs of each procedure counted for the per-Run figures")
    parser.add_argument("--hop-delay", type=float, default=0.0005,
                        help="seconds the proxy holds each chunk each way (0: no hop phase)")
    parser.add_argument("--dialect", choices=["postgresql", "sqlite", "both"], default="both")
    args = parser.parse_args(argv)
    print(f"runledger ledger benchmark: {args.workers} processes, {args.seconds:g} s per phase "
          f"in {SLICES} alternating slices, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, Python {sys.version.split()[0]}, SQLite "
          f"{sqlite3.sqlite_version}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", flush=True)
    for dialect in ["postgresql", "sqlite"] if args.dialect == "both" else [args.dialect]:
        bench(dialect, args)


if __name__ == "__main__":
    main()
