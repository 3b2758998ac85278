"""Ledger throughput against a raw-driver baseline measured in the same run, by the same processes.

For each dialect (PostgreSQL, then SQLite in one WAL file), on a fresh database dropped afterwards,
N worker processes (default 8) run, all starting each phase together at a barrier:

1. baseline: one single-row upsert per round trip through the raw driver, autocommit
   (psycopg / sqlite3), on distinct keys;
2. ledger: full Run cycles on distinct keys: register, claim, save_input, complete with one
   outbox row (4 ledger transitions per cycle), register and claim taken together by
   ``Ledger.register_and_claim`` (one statement, as the pipeline does): 3 round trips;
3. the same cycle with ``register`` and ``claim`` as two calls: 4 round trips;
4. (PostgreSQL) replay: the exact statements of one ledger cycle, recorded from the driver once,
   replayed through raw psycopg with fresh identifiers and no runledger code around them. This
   is the ceiling any client code could reach with these statements: what is left between it
   and the baseline is the database's own work for a Run, its Attempt and its outbox row.

The phases alternate in slices (B L S B L S ...) so that a noisy neighbour on a shared machine
hurts all alike; the ratio is ledger transitions/s over baseline statements/s.
5. contention: the N processes claim the same key at once, ``--rounds`` times: exactly one
   winner per round, and the p50/p99 claim latency.

Usage: uv run python bench/ledger_bench.py [--seconds 10] [--workers 8] [--dialect both]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.types.json import Jsonb

from store import Claim, Ledger, OutboxMessage, RunIdentity
from store.settings import LedgerSettings

TRANSITIONS_PER_CYCLE = 4
TARGET_RATIO = 0.6
SLICES = 4
WARMUP = 20
ADMIN_URL = os.environ.get(
    "RUNLEDGER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PERIOD = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=900)
UPSERT = "INSERT INTO bench_upsert (k, v) VALUES ({p}, {p}) ON CONFLICT (k) DO UPDATE SET v = bench_upsert.v + 1"


@dataclass(frozen=True)
class Target:
    """One benchmark database: its ledger URL and how the raw driver reaches it."""

    dialect: str
    url: str
    raw: str  # libpq URL, or the SQLite file path


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


# --- the worker processes ---------------------------------------------------------------------


class Worker:
    """One benchmark process: a Ledger and a raw driver connection, kept for the whole run."""

    def __init__(self, target: Target, index: int) -> None:
        self.index = index
        self.ledger = Ledger.connect(target.url)
        self.owner = f"bench:{os.getpid()}"
        self.keys = 0
        self.recipient = f"user{index}@example.com"
        if target.dialect == "postgresql":
            pg = psycopg.connect(target.raw, autocommit=True)
            sql = UPSERT.format(p="%s")
            self.upsert: Callable[[str, int], Any] = lambda k, v: pg.execute(sql, (k, v))
            self.pg = pg
            self.recorded = self.record_cycle(target)
        else:
            lite = sqlite3.connect(target.raw, timeout=30, isolation_level=None)
            lite.execute("PRAGMA journal_mode=WAL")
            # The ledger's own commit mode: both sides wait for the disk alike.
            lite.execute(f"PRAGMA synchronous={LedgerSettings().sqlite_synchronous.upper()}")
            sql = UPSERT.format(p="?")
            self.upsert = lambda k, v: lite.execute(sql, (k, v))

    def key(self) -> str:
        self.keys += 1
        return f"w{self.index}-{self.keys}"

    def baseline(self) -> None:
        """One single-row upsert, one round trip."""
        self.upsert(self.key(), self.keys)

    def cycle(self) -> None:
        """One full Run cycle on a fresh key: 4 ledger transitions in 3 statements."""
        key = self.key()
        claim = self.ledger.register_and_claim(
            RunIdentity("bench", key, PERIOD, "1"), {"recipients": 1}, owner=self.owner, lease=LEASE
        ).claim
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
        key = f"w{self.index}-RECORDED"
        claim = ledger.register_and_claim(
            RunIdentity("bench", key, PERIOD, "1"), {"recipients": 1}, owner=self.owner, lease=LEASE
        ).claim
        assert claim is not None
        self.finish(key, claim, ledger)
        cycle = list(recorded)
        [message] = ledger.messages(run_id=claim.run_id)
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

    def timed(self, step: Callable[[], None], seconds: float, barrier: Barrier) -> tuple[int, float]:
        for _ in range(WARMUP):
            step()
        barrier.wait()
        count, start = 0, time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            step()
            count += 1
        return count, time.perf_counter() - start

    def contend(self, run_ids: list[str], barrier: Barrier) -> list[tuple[int, bool, float]]:
        results = []
        for round_no, run_id in enumerate(run_ids):
            self.ledger.get(run_id)  # a warm pooled connection, so the race is the claim itself
            barrier.wait()
            start = time.perf_counter()
            won = self.ledger.claim(run_id, self.owner, LEASE) is not None
            results.append((round_no, won, time.perf_counter() - start))
        return results


def serve(target: Target, index: int, barrier: Barrier, commands: Any, results: Any) -> None:
    """Process body: run each phase the parent sends, report its result."""
    worker = Worker(target, index)
    while (command := commands.get()) is not None:
        phase, argument = command
        if phase == "contention":
            results.put(worker.contend(argument, barrier))
        else:
            step = {"baseline": worker.baseline, "ledger": worker.cycle,
                    "separate": worker.separate_cycle, "replay": worker.replay_cycle}[phase]
            results.put(worker.timed(step, argument, barrier))
    worker.ledger.close()


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
        return [self.results.get(timeout=900) for _ in self.commands]

    def rate(self, phase: str, seconds: float) -> tuple[int, float]:
        """Operations and the mean elapsed time over all workers for one slice."""
        done = self.run(phase, seconds)
        return sum(c for c, _ in done), statistics.fmean(e for _, e in done)

    def stop(self) -> None:
        for q in self.commands:
            q.put(None)
        for p in self.processes:
            p.join(timeout=60)
            if p.exitcode != 0:
                raise RuntimeError(f"a benchmark worker exited with {p.exitcode}")


# --- databases ---------------------------------------------------------------------------------


def create_postgres() -> tuple[Target, Callable[[], None]]:
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"rlbench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(ADMIN_URL).set(database=name)
    raw = url.set(drivername="postgresql").render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return Target("postgresql", url.render_as_string(hide_password=False), raw), drop


def create_sqlite() -> tuple[Target, Callable[[], None]]:
    directory = tempfile.TemporaryDirectory(prefix="rlbench_")
    path = Path(directory.name) / "ledger.db"
    return Target("sqlite", f"sqlite:///{path}", str(path)), directory.cleanup


def prepare(target: Target) -> None:
    ledger = Ledger.connect(target.url)
    ledger.migrate()
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE bench_upsert (k TEXT PRIMARY KEY, v BIGINT NOT NULL)")
    ledger.close()


# --- the benchmark -----------------------------------------------------------------------------


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def bench(dialect: str, workers: int, seconds: float, rounds: int) -> None:
    target, drop = create_postgres() if dialect == "postgresql" else create_sqlite()
    crew = None
    try:
        prepare(target)
        crew = Crew(target, workers)
        totals = {"baseline": [0, 0.0], "ledger": [0, 0.0], "separate": [0, 0.0]}
        if dialect == "postgresql":
            totals["replay"] = [0, 0.0]
        for _ in range(SLICES):
            for phase in totals:
                count, elapsed = crew.rate(phase, seconds / SLICES)
                totals[phase][0] += count
                totals[phase][1] += elapsed
        base = totals["baseline"][0] / totals["baseline"][1]
        runs = totals["ledger"][0] / totals["ledger"][1]
        transitions = runs * TRANSITIONS_PER_CYCLE
        separate = totals["separate"][0] / totals["separate"][1]
        driver = "psycopg" if dialect == "postgresql" else "sqlite3"
        print(f"[{dialect}] baseline, raw {driver} autocommit, 1 single-row upsert per round trip: "
              f"{base:,.0f} statements/s")
        print(f"[{dialect}] ledger, register_and_claim + save_input + complete with 1 outbox row: "
              f"{runs:,.0f} Runs/s = {transitions:,.0f} transitions/s")
        print(f"[{dialect}] ledger, register + claim as two calls (4 round trips): "
              f"{separate:,.0f} Runs/s = {separate * TRANSITIONS_PER_CYCLE:,.0f} transitions/s "
              f"(ratio {separate * TRANSITIONS_PER_CYCLE / base:.2f})")
        if "replay" in totals:
            replayed = totals["replay"][0] / totals["replay"][1]
            print(f"[{dialect}] the same 3 statements replayed through raw psycopg, no runledger "
                  f"code: {replayed:,.0f} Runs/s = {replayed * TRANSITIONS_PER_CYCLE:,.0f} "
                  f"transitions/s (ratio {replayed * TRANSITIONS_PER_CYCLE / base:.2f}, the "
                  f"ceiling of these statements; the ledger reached {runs / replayed:.0%} of it)")
        ratio = transitions / base
        verdict = "meets" if ratio >= TARGET_RATIO else "BELOW"
        print(f"[{dialect}] ratio ledger transitions/s : baseline statements/s = {ratio:.2f} "
              f"({verdict} the {TARGET_RATIO} target)")

        ledger = Ledger.connect(target.url)
        run_ids = [ledger.register(RunIdentity("contention", f"key-{r}", PERIOD, "1")).run_id
                   for r in range(rounds)]
        ledger.close()
        winners = [0] * rounds
        latencies: list[float] = []
        for results in crew.run("contention", run_ids):
            for round_no, won, latency in results:
                winners[round_no] += won
                latencies.append(latency)
        single = all(w == 1 for w in winners)
        print(f"[{dialect}] contention, {workers} processes x {rounds} rounds on 1 key each: "
              f"{'exactly 1 winner in every round' if single else f'WINNERS PER ROUND {winners}'}; "
              f"claim latency p50 {percentile(latencies, 50) * 1000:.1f} ms, "
              f"p99 {percentile(latencies, 99) * 1000:.1f} ms")
        if not single:
            raise SystemExit(f"[{dialect}] a contention round did not have exactly one winner")
    finally:
        if crew is not None:
            crew.stop()
        drop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per phase")
    parser.add_argument("--workers", type=int, default=8, help="worker processes")
    parser.add_argument("--rounds", type=int, default=50, help="single-key contention rounds")
    parser.add_argument("--dialect", choices=["postgresql", "sqlite", "both"], default="both")
    args = parser.parse_args(argv)
    print(f"runledger ledger benchmark: {args.workers} processes, {args.seconds:g} s per phase "
          f"in {SLICES} alternating slices, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}")
    for dialect in ["postgresql", "sqlite"] if args.dialect == "both" else [args.dialect]:
        bench(dialect, args.workers, args.seconds, args.rounds)


if __name__ == "__main__":
    main()
