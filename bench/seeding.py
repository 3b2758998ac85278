"""A large ledger seeded fast with bulk SQL (PostgreSQL: generate_series; SQLite: a recursive
CTE): Runs completed long ago, with documents, attempts and outbox rows, for the prune bench and
the retention tests to prune."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from store import Ledger

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


def old(ledger: Ledger, days: int = 400) -> datetime:
    """A completion time ``days`` before the database clock: older than any retention used."""
    return ledger.now() - timedelta(days=days)
