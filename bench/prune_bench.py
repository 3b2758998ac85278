"""Prune a seeded ledger with no other writer: how fast `runledger prune` makes tombstones.

``uv run python -m bench.prune_bench [--runs 100000] [--batch-size 1000]`` seeds the Runs
(bench/seeding.py: about 1.4 kB of documents, one Attempt, one outbox
message and one delivery attempt each) in a fresh SQLite file and a fresh PostgreSQL
database, prunes them with a 90-day retention and prints the time, Runs per second and bytes
reclaimed per ledger."""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench.databases import postgres_database
from bench.seeding import old, seed
from flows.jobs.competitor_summary import job as competitor_summary
from flows.retention import prune_ledger
from store import Ledger

JOB = dataclasses.replace(competitor_summary, name="prune-bench")


def measure(url: str, runs: int, batch_size: int) -> str:
    with Ledger.connect(url) as ledger:
        ledger.migrate()
        seed(ledger, JOB.name, runs, old(ledger))
        started = time.perf_counter()
        report = prune_ledger(ledger, timedelta(days=90), [JOB], batch_size=batch_size)
        seconds = time.perf_counter() - started
        pruned = report.total("runs")
        return (f"{ledger.dialect}: {pruned:,} Runs pruned in {seconds:.1f} s "
                f"({pruned / seconds:,.0f} Runs/s, {report.total('batches')} batches of "
                f"{batch_size}, {seconds / report.total('batches'):.2f} s each); bytes "
                f"reclaimed {report.reclaimed_bytes:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        print(measure(f"sqlite:///{Path(directory) / 'bench.db'}", args.runs, args.batch_size))
    with postgres_database() as url:
        if url is not None:
            print(measure(url, args.runs, args.batch_size))


if __name__ == "__main__":
    main()
