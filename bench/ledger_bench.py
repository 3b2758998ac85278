"""Ledger throughput against a raw-driver baseline measured in the same run.

For each dialect (PostgreSQL, then SQLite in one WAL file), on a fresh database that is dropped
afterwards:

1. baseline: N processes, each sending one single-row upsert per round trip through the raw
   driver (psycopg autocommit / sqlite3 autocommit) for ``--seconds``;
2. ledger: N processes, each doing full Run cycles on distinct keys (register, claim,
   save_input, complete with one outbox row = 4 ledger transitions) for ``--seconds``;
3. contention: N processes claim the same key at once, ``--rounds`` times: exactly one winner
   per round, and the claim latency percentiles.

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

from store import Ledger, OutboxMessage, RunIdentity

TRANSITIONS_PER_CYCLE = 4
TARGET_RATIO = 0.6
ADMIN_URL = os.environ.get(
    "RUNLEDGER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PERIOD = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=900)
WARMUP_CYCLES = 20


@dataclass(frozen=True)
class Target:
    """One benchmark database: its ledger URL and how the raw driver reaches it."""

    dialect: str
    url: str
    raw: str  # libpq conninfo URL, or SQLite file path


# --- worker bodies (module level: spawned processes import them) -----------------------------


def _run_timed(step: Callable[[int], None], barrier: Barrier, seconds: float) -> tuple[int, float]:
    for i in range(WARMUP_CYCLES):
        step(-1 - i)
    barrier.wait()
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        step(count)
        count += 1
    return count, time.perf_counter() - start


def baseline_worker(target: Target, worker: int, seconds: float, barrier: Barrier, out: Any) -> None:
    """One single-row upsert per round trip, autocommit, through the raw driver."""
    sql = (
        "INSERT INTO bench_upsert (k, v) VALUES ({p}, {p}) "
        "ON CONFLICT (k) DO UPDATE SET v = bench_upsert.v + 1"
    )
    if target.dialect == "postgresql":
        pg = psycopg.connect(target.raw, autocommit=True)
        statement = sql.format(p="%s")

        def step(i: int) -> None:
            pg.execute(statement, (f"{worker}-{i}", i))

        out.put(_run_timed(step, barrier, seconds))
        pg.close()
        return
    lite = sqlite3.connect(target.raw, timeout=30, isolation_level=None)
    lite.execute("PRAGMA journal_mode=WAL")
    lite.execute("PRAGMA synchronous=NORMAL")
    statement = sql.format(p="?")

    def lite_step(i: int) -> None:
        lite.execute(statement, (f"{worker}-{i}", i))

    out.put(_run_timed(lite_step, barrier, seconds))
    lite.close()


def ledger_worker(target: Target, worker: int, seconds: float, barrier: Barrier, out: Any) -> None:
    """Full Run cycles on distinct keys: register, claim, save_input, complete + 1 outbox row."""
    ledger = Ledger.connect(target.url)
    owner = f"bench:{os.getpid()}"

    def step(i: int) -> None:
        run = ledger.register(
            RunIdentity("bench", f"w{worker}-{i}", PERIOD, "1"), params={"recipients": 1}
        )
        claim = ledger.claim(run.run_id, owner, LEASE)
        assert claim is not None, "a fresh key must be claimable"
        raw = ledger.save_input(claim, {"items": [i, worker]})
        ledger.complete(
            claim,
            output={"summary": f"{len(raw['items'])} items"},
            messages=[OutboxMessage(f"user{worker}@example.com", f"digest {i}", "body")],
        )

    out.put(_run_timed(step, barrier, seconds))
    ledger.close()


def contention_worker(
    target: Target, run_ids: list[str], barrier: Barrier, out: Any
) -> None:
    """Claim every round's single key together with the other processes; time each claim."""
    ledger = Ledger.connect(target.url)
    owner = f"contender:{os.getpid()}"
    ledger.get(run_ids[0])  # open the pooled connection before the race
    results: list[tuple[int, bool, float]] = []
    for round_no, run_id in enumerate(run_ids):
        barrier.wait()
        start = time.perf_counter()
        won = ledger.claim(run_id, owner, LEASE) is not None
        results.append((round_no, won, time.perf_counter() - start))
    out.put(results)
    ledger.close()


# --- phases ---------------------------------------------------------------------------------


def _spawn(target_fn: Callable[..., None], args_for: Callable[[int], tuple[Any, ...]], n: int,
           barrier: Barrier | None = None) -> list[Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target_fn, args=(*args_for(i), out)) for i in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"a benchmark worker exited with {p.exitcode}")
    return results


def timed_phase(fn: Callable[..., None], target: Target, workers: int, seconds: float) -> float:
    """Operations per second summed over ``workers`` processes that start together."""
    barrier = mp.get_context("spawn").Barrier(workers)
    results = _spawn(fn, lambda i: (target, i, seconds, barrier), workers)
    return sum(count / elapsed for count, elapsed in results)


def contention_phase(target: Target, workers: int, rounds: int) -> tuple[list[int], list[float]]:
    """Winners per round and every claim's latency (seconds)."""
    ledger = Ledger.connect(target.url)
    run_ids = [
        ledger.register(RunIdentity("bench-contention", f"key-{r}", PERIOD, "1")).run_id
        for r in range(rounds)
    ]
    ledger.close()
    barrier = mp.get_context("spawn").Barrier(workers)
    per_worker = _spawn(contention_worker, lambda i: (target, run_ids, barrier), workers)
    winners = [0] * rounds
    latencies: list[float] = []
    for results in per_worker:
        for round_no, won, latency in results:
            winners[round_no] += won
            latencies.append(latency)
    return winners, latencies


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


# --- databases ------------------------------------------------------------------------------


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


def bench(dialect: str, workers: int, seconds: float, rounds: int) -> float:
    target, drop = create_postgres() if dialect == "postgresql" else create_sqlite()
    try:
        prepare(target)
        driver = "psycopg" if dialect == "postgresql" else "sqlite3"
        base = timed_phase(baseline_worker, target, workers, seconds)
        print(f"[{dialect}] baseline (raw {driver}, autocommit, 1 single-row upsert per round "
              f"trip): {base:,.0f} statements/s")
        runs = timed_phase(ledger_worker, target, workers, seconds)
        transitions = runs * TRANSITIONS_PER_CYCLE
        ratio = transitions / base
        print(f"[{dialect}] ledger (register, claim, save_input, complete + 1 outbox row): "
              f"{runs:,.0f} Runs/s = {transitions:,.0f} transitions/s")
        verdict = "meets" if ratio >= TARGET_RATIO else "BELOW"
        print(f"[{dialect}] ratio ledger transitions/s / baseline = {ratio:.2f} "
              f"({verdict} the {TARGET_RATIO} target)")
        winners, latencies = contention_phase(target, workers, rounds)
        single = all(w == 1 for w in winners)
        print(f"[{dialect}] contention: {rounds} rounds x {workers} processes on 1 key: "
              f"{'exactly 1 winner every round' if single else f'WINNERS PER ROUND {winners}'}; "
              f"claim latency p50 {percentile(latencies, 50) * 1000:.1f} ms, "
              f"p99 {percentile(latencies, 99) * 1000:.1f} ms")
        if not single:
            raise SystemExit(f"[{dialect}] contention produced more or fewer than one winner")
        return ratio
    finally:
        drop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each timed phase")
    parser.add_argument("--workers", type=int, default=8, help="worker processes per phase")
    parser.add_argument("--rounds", type=int, default=50, help="single-key contention rounds")
    parser.add_argument("--dialect", choices=["postgresql", "sqlite", "both"], default="both")
    args = parser.parse_args(argv)
    print(f"runledger ledger benchmark: {args.workers} processes, {args.seconds:g} s per phase, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}")
    dialects = ["postgresql", "sqlite"] if args.dialect == "both" else [args.dialect]
    for dialect in dialects:
        bench(dialect, args.workers, args.seconds, args.rounds)


if __name__ == "__main__":
    main()
