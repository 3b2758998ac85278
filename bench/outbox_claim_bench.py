"""Outbox claim latency with a large backlog against a small one, measured in the same run.

    uv run python bench/outbox_claim_bench.py [--backlog 50000] [--claims 30] [--dialects ...]

For each dialect, two fresh ledgers: a small outbox (``--small`` due messages, the baseline) and
a large one (``--backlog`` due messages), each with nine sent messages per due one, as an outbox
looks after months of deliveries. A dispatcher claims ``--limit`` messages ``--claims`` times;
the script prints the median claim latency of each and their ratio. A claim that reads the due
messages in order from an index costs about the same whatever the backlog (ratio near 1); one
that sorts the whole backlog grows with it."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.databases import postgres_database
from store import Ledger

FILL_POSTGRES = """
INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body, status, attempts,
                    fence, next_attempt_at, created_at, updated_at)
SELECT 'm' || g, 'r', 'email', 'u' || g || '@example.com', 'digest', 'body',
       CASE WHEN g % 10 = 0 THEN 'pending' ELSE 'sent' END, 0, 0,
       now() - interval '1 day' + g * interval '1 ms', now(), now()
FROM generate_series(1, :rows) AS g
"""
FILL_SQLITE = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :rows)
INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body, status, attempts,
                    fence, next_attempt_at, created_at, updated_at)
SELECT 'm' || n, 'r', 'email', 'u' || n || '@example.com', 'digest', 'body',
       CASE WHEN n % 10 = 0 THEN 'pending' ELSE 'sent' END, 0, 0,
       strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 day', printf('+%d seconds', n / 1000)) || '000',
       strftime('%Y-%m-%d %H:%M:%f', 'now') || '000', strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'
FROM g
"""
RUN = """
INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, status,
                  fence, attempts, created_at, updated_at)
VALUES ('r', 'bench', 'outbox', CURRENT_TIMESTAMP, '1', 'f', 'completed', 1, 1,
        CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)
"""


@contextmanager
def ledger(dialect: str, due: int, directory: Path) -> Iterator[Ledger | None]:
    """A migrated ledger whose outbox holds ``due`` due messages and nine sent ones for each."""
    import sqlalchemy as sa

    with (postgres_database() if dialect == "postgres" else _sqlite(directory)) as url:
        if url is None:
            yield None
            return
        opened = Ledger.connect(url)
        opened.migrate()
        with opened.engine.begin() as conn:
            conn.execute(sa.text(RUN))
            conn.execute(sa.text(FILL_POSTGRES if dialect == "postgres" else FILL_SQLITE),
                         {"rows": due * 10})
            conn.exec_driver_sql("ANALYZE")
        try:
            yield opened
        finally:
            opened.close()


@contextmanager
def _sqlite(directory: Path) -> Iterator[str]:
    yield f"sqlite:///{directory / f'outbox-{time.monotonic_ns()}.db'}"


def median_claim(opened: Ledger, claims: int, limit: int) -> float:
    """Median seconds of ``claims`` claims of ``limit`` messages (after two warm-up claims)."""
    for _ in range(2):
        opened.outbox.claim_messages("bench:warm-up", limit, 600)
    seconds = []
    for _ in range(claims):
        started = time.perf_counter()
        claimed = opened.outbox.claim_messages(f"bench:{os.getpid()}", limit, 600)
        seconds.append(time.perf_counter() - started)
        assert len(claimed) == limit, f"claimed {len(claimed)} of {limit}"
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backlog", type=int, default=50_000, help="due messages, large outbox")
    parser.add_argument("--small", type=int, default=1_000, help="due messages, baseline outbox")
    parser.add_argument("--claims", type=int, default=30)
    parser.add_argument("--limit", type=int, default=20, help="messages per claim")
    parser.add_argument("--dialects", nargs="+", default=["postgres", "sqlite"],
                        choices=["postgres", "sqlite"])
    args = parser.parse_args()
    if min(args.claims, args.limit) < 1 or args.backlog < args.small:
        parser.error("--claims and --limit must be positive and --backlog at least --small")
    if args.small < (args.claims + 2) * args.limit:  # each claim takes messages for good
        parser.error(f"--small must be at least (--claims + 2 warm-up claims) x --limit = "
                     f"{(args.claims + 2) * args.limit} so that every claim finds --limit due "
                     "messages")
    print(f"outbox claim benchmark: {args.claims} claims of {args.limit}, nine sent messages per "
          f"due one, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as directory:
        for dialect in args.dialects:
            medians = {}
            for due in (args.small, args.backlog):
                with ledger(dialect, due, Path(directory)) as opened:
                    if opened is None:
                        break
                    medians[due] = median_claim(opened, args.claims, args.limit)
            if len(medians) < 2:
                continue
            small, large = medians[args.small], medians[args.backlog]
            print(f"{dialect:8}: {args.small:,} due -> {small * 1000:.2f} ms per claim; "
                  f"{args.backlog:,} due -> {large * 1000:.2f} ms per claim; "
                  f"ratio {large / small:.2f} (1.0 = independent of the backlog)", flush=True)


if __name__ == "__main__":
    main()
