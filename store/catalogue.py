"""The SQL catalogue: every named statement as it compiles on each dialect, under its name and
rule, in ``store/sql/<dialect>.sql``, the file to read to audit the ledger. ``python -m
store.sql`` checks the committed files (``make lint``); ``--write`` rewrites them after a
statement is added or changed."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from sqlalchemy.dialects.postgresql import psycopg as pg_dialect
from sqlalchemy.dialects.sqlite import pysqlite as sqlite_dialect
from sqlalchemy.engine import Dialect

# Every module that defines statements: importing them fills the registry.
from store import (
    approvals,
    budgets,
    checkpoints,
    database,
    dialect,
    endpoint_limits,
    ids,
    model_calls,
    occurrences,
    outbox,
    outbox_queue,
    outbox_reads,
    registration,
    revisions,
    run_reads,
    runs,
    savings,
    stats,
    tombstones,
)
from store.statement import DIALECTS, STATEMENTS, Statement

SQL_FILES = Path(__file__).with_name("sql")
# The files' order: module by module as listed here, each module's statements in the order it
# defines them. The order the modules happen to be imported in (which fills the registry) must
# not reorder the files: a moved import is no change to review. A module may hold a statement
# of a module below it (database: dialect's begin_write), so each module follows those it uses.
STATEMENT_MODULES = (dialect, budgets, endpoint_limits, model_calls, checkpoints, savings, database,
                     ids, occurrences, outbox_queue, outbox, outbox_reads, approvals, run_reads,
                     registration, runs, revisions, stats, tombstones)


def statements_in_order() -> list[Statement]:
    """Every named statement once, in the files' order; any not held as a global by a listed
    module, last, in the order defined."""
    ordered = {value.name: value for module in STATEMENT_MODULES
               for value in vars(module).values() if isinstance(value, Statement)}
    return [*ordered.values(), *(s for name, s in STATEMENTS.items() if name not in ordered)]


def _dialect(name: str) -> Dialect:
    """The dialect as the ledger's engines configure it (positional parameters on both)."""
    if name == "postgresql":
        return pg_dialect.dialect(paramstyle="format")  # type: ignore[no-untyped-call]
    return sqlite_dialect.dialect()


def sql_text(dialect_name: str) -> str:
    """Every statement sent on ``dialect_name``, as it compiles, under its name and rule."""
    target = _dialect(dialect_name)
    parts = [f"-- The SQL runledger's ledger sends to {dialect_name}, statement by statement.\n"
             "-- Written by `python -m store.sql --write`; a test fails when it is stale.\n"]
    for statement in statements_in_order():
        if dialect_name not in statement.dialects:
            continue
        compiled = statement.compiled(target)
        order = compiled.order or tuple(compiled.binds)
        rule = textwrap.wrap(statement.rule, 96)
        parts.append("\n".join([
            f"-- name: {statement.name}",
            *(f"-- {line}" for line in rule),
            *([f"-- parameters: {', '.join(order)}"] if order else []),
            compiled.sql.strip() + ";",
        ]) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None, files: Path = SQL_FILES) -> int:
    """Write (``--write``) or check the committed SQL files; 1 when one is stale."""
    parser = argparse.ArgumentParser(prog="python -m store.sql", description=main.__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite store/sql/*.sql")
    args = parser.parse_args(argv)
    stale = []
    for name in DIALECTS:
        path = files / f"{name}.sql"
        text = sql_text(name)
        if args.write:
            files.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(str(path))
    if stale:
        print(f"stale: {', '.join(stale)}; run `python -m store.sql --write`",
              file=sys.stderr)
        return 1
    return 0
