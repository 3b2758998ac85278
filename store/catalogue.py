"""The SQL catalogue: every named statement as it compiles on each dialect, under its name and
rule, in ``store/sql/<dialect>.sql``, the file to read to audit the ledger. It reads as source:
parameters by name (``%(run_id)s``, ``:run_id``) and the values a statement binds itself as SQL
literals; the ledger sends the same build of the statement with positional parameters (faster
to bind), and a test proves the two are one statement. ``python -m store.sql`` checks the
committed files (``make lint``); ``--write`` rewrites them after a statement is added or
changed."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import psycopg as pg_dialect
from sqlalchemy.dialects.sqlite import pysqlite as sqlite_dialect
from sqlalchemy.engine import Dialect

# Every module that defines statements: importing them fills the registry.
from store import (
    announced_limits,
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
STATEMENT_MODULES = (dialect, budgets, endpoint_limits, announced_limits, model_calls, checkpoints, savings, database,
                     ids, occurrences, outbox_queue, outbox, outbox_reads, approvals, run_reads,
                     registration, runs, revisions, stats, tombstones)


def statements_in_order() -> list[Statement]:
    """Every named statement once, in the files' order; any not held as a global by a listed
    module, last, in the order defined."""
    ordered = {value.name: value for module in STATEMENT_MODULES
               for value in vars(module).values() if isinstance(value, Statement)}
    return [*ordered.values(), *(s for name, s in STATEMENTS.items() if name not in ordered)]


def engine_dialect(name: str) -> Dialect:
    """The dialect as the ledger's engines configure it (positional parameters on both)."""
    if name == "postgresql":
        return pg_dialect.dialect(paramstyle="format")  # type: ignore[no-untyped-call]
    return sqlite_dialect.dialect()


def _named_dialect(name: str) -> Dialect:
    """The dialect printing parameters by name: ``%(run_id)s`` on PostgreSQL, ``:run_id``
    on SQLite."""
    if name == "postgresql":
        return pg_dialect.dialect(paramstyle="pyformat")  # type: ignore[no-untyped-call]
    return sqlite_dialect.dialect(paramstyle="named")


def named_sql(statement: Statement, dialect_name: str, *, inline: bool = True) -> str:
    """``statement`` as it compiles on ``dialect_name`` with parameters by name, the values
    bound inside it written as SQL literals (``inline``) or kept as parameters."""
    target = _named_dialect(dialect_name)

    # The dialect's own compiler, but for the parameters that carry the statement's own value:
    # a caller-given one stays a parameter (required: it has no value to write).
    class Named(target.statement_compiler):  # type: ignore[name-defined,misc]
        def visit_bindparam(self, bindparam: sa.BindParameter[Any], **kw: Any) -> str:
            if inline and not bindparam.required:
                kw["literal_binds"] = True
            return str(super().visit_bindparam(bindparam, **kw))

    return str(Named(target, statement.build(dialect_name)))


def parameters(statement: Statement, dialect_name: str) -> tuple[str, ...]:
    """The names a caller gives ``statement`` on ``dialect_name``, each once, in the order
    they are sent (the values bound inside it are no parameters of the caller's)."""
    compiled = statement.compiled(engine_dialect(dialect_name))
    return tuple(dict.fromkeys(n for n in compiled.order or () if n not in compiled.defaults))


def sql_text(dialect_name: str) -> str:
    """Every statement sent on ``dialect_name``, as it compiles with named parameters, under
    its name and rule."""
    parts = [f"-- The SQL runledger's ledger sends to {dialect_name}, statement by statement.\n"
             "-- Written by `python -m store.sql --write`; a test fails when it is stale.\n"]
    for statement in statements_in_order():
        if dialect_name not in statement.dialects:
            continue
        names = parameters(statement, dialect_name)
        rule = textwrap.wrap(statement.rule, 96)
        parts.append("\n".join([
            f"-- name: {statement.name}",
            *(f"-- {line}" for line in rule),
            *([f"-- parameters: {', '.join(names)}"] if names else []),
            named_sql(statement, dialect_name).strip() + ";",
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
