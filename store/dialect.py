"""What differs in the SQL between PostgreSQL and SQLite, and nothing else: the database clock,
upserts, JSON parameters as rows, how a write takes its lock (BEGIN IMMEDIATE, SKIP LOCKED) and
whether a transition's follow-up writes ride in its statement. Connections: ``store.database``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.expression import FunctionElement

from store.columns import UTCDateTime
from store.statement import Statement

# SQLAlchemy stores SQLite datetimes as 'YYYY-MM-DD HH:MM:SS.ffffff' text; the clock must render
# the same shape (strftime's %f has milliseconds only) so that text comparison is time order.
_SQLITE_CLOCK = "strftime('%Y-%m-%d %H:%M:%f', 'now'{shift}) || '000'"


class db_now(FunctionElement[Any]):
    """The database clock, optionally shifted by a number of seconds (a bound value).

    Ownership decisions (lease expiry, due times) compare against this, never a worker's clock."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "postgresql")
def _pg_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    args = list(element.clauses)
    if not args:
        return "statement_timestamp()"
    return f"(statement_timestamp() + make_interval(secs => {compiler.process(args[0], **kw)}))"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    args = list(element.clauses)
    shift = ""
    if args:
        shift = ", printf('%+.6f seconds', " + compiler.process(args[0], **kw) + ")"
    return "(" + _SQLITE_CLOCK.format(shift=shift) + ")"


class least(FunctionElement[Any]):
    """The smallest of its arguments (PostgreSQL's LEAST, SQLite's scalar min)."""

    inherit_cache = True
    name = "least"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.type = next(iter(self.clauses)).type


class greatest(least):
    """The largest of its arguments (PostgreSQL's GREATEST, SQLite's scalar max)."""

    inherit_cache = True
    name = "greatest"


@compiles(least, "postgresql")
@compiles(greatest, "postgresql")
def _pg_extreme(element: least, compiler: SQLCompiler, **kw: Any) -> str:
    return f"{element.name.upper()}({compiler.process(element.clauses, **kw)})"


@compiles(least, "sqlite")
@compiles(greatest, "sqlite")
def _sqlite_extreme(element: least, compiler: SQLCompiler, **kw: Any) -> str:
    name = "min" if isinstance(element, least) and not isinstance(element, greatest) else "max"
    return f"{name}({compiler.process(element.clauses, **kw)})"


class seconds_since(FunctionElement[Any]):
    """Seconds from a stored timestamp to the database clock (negative for a later one), as a
    float: what a token bucket refills by."""

    type = sa.Float()
    inherit_cache = True
    name = "seconds_since"


@compiles(seconds_since, "postgresql")
def _pg_since(element: seconds_since, compiler: SQLCompiler, **kw: Any) -> str:
    return (f"extract(epoch from (statement_timestamp() - "
            f"{compiler.process(element.clauses, **kw)}))::float8")


@compiles(seconds_since, "sqlite")
def _sqlite_since(element: seconds_since, compiler: SQLCompiler, **kw: Any) -> str:
    # julianday reads the stored text shape (any number of fractional digits).
    return (f"((julianday('now') - julianday({compiler.process(element.clauses, **kw)}))"
            " * 86400.0)")


def upsert(dialect: str, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT of ``dialect`` that can take an ON CONFLICT clause."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


def insert_ignoring_conflicts(dialect: str, table: sa.Table) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING (any unique constraint) for ``dialect``."""
    return upsert(dialect, table).on_conflict_do_nothing()


def json_rows(
    dialect: str, param: str, columns: Sequence[sa.Column[Any]], *, one: bool = False
) -> sa.Select[Any]:
    """The rows of a JSON array of objects bound as ``param`` (``one``: a single JSON object),
    as a SELECT of ``columns`` (by name and type): a whole batch is one parameter, so one
    prepared statement fits any size. PostgreSQL's planner counts a single object as one row
    (an array as a hundred), which keeps its joins on indexes."""
    if dialect == "postgresql":
        given = (
            getattr(sa.func, "jsonb_to_record" if one else "jsonb_to_recordset")(
                sa.bindparam(param, type_=JSONB))
            .table_valued(*[sa.column(c.key, c.type) for c in columns])
            .render_derived(name="given", with_types=True)
        )
        return sa.select(*[given.c[c.key] for c in columns])
    if one:
        value: Any = sa.bindparam(param, type_=sa.JSON)
        return sa.select(*[sa.func.json_extract(value, f"$.{c.key}").label(c.key) for c in columns])
    each = sa.func.json_each(sa.bindparam(param, type_=sa.JSON)).table_valued("value", name="item")
    return sa.select(
        *[sa.func.json_extract(each.c.value, f"$.{c.key}").label(c.key) for c in columns]
    )


def json_timestamp(dialect: str, value: datetime) -> str:
    """A UTC timestamp as a JSON string that ``json_rows`` turns back into the column's value:
    ISO 8601 for PostgreSQL's typed records, SQLAlchemy's stored text shape for SQLite."""
    if dialect == "postgresql":
        return value.isoformat()
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def one_statement_writes(conn: Connection) -> bool:
    """Whether a transition's follow-up writes (its Attempt row, its outbox rows) ride in its
    guarded statement as data-modifying CTEs: on PostgreSQL, one round trip; SQLite has no
    such CTEs and sends them as statements of their own, inside the transition's transaction."""
    return conn.dialect.name == "postgresql"


def skip_locked(query: sa.Select[Any], dialect: str) -> sa.Select[Any]:
    """Rows another transaction has locked are skipped, not waited for (PostgreSQL); SQLite's
    writers already hold the whole database (BEGIN IMMEDIATE), so nobody else has any."""
    return query.with_for_update(skip_locked=True) if dialect == "postgresql" else query


class stored_size(FunctionElement[Any]):
    """The bytes a value takes as stored (0 for NULL): PostgreSQL's ``pg_column_size``,
    SQLite's length of the stored text or blob."""

    type = sa.BigInteger()
    inherit_cache = True
    name = "stored_size"


@compiles(stored_size, "postgresql")
def _pg_size(element: stored_size, compiler: SQLCompiler, **kw: Any) -> str:
    return f"coalesce(pg_column_size({compiler.process(element.clauses, **kw)}), 0)"


@compiles(stored_size, "sqlite")
def _sqlite_size(element: stored_size, compiler: SQLCompiler, **kw: Any) -> str:
    return f"coalesce(length(CAST({compiler.process(element.clauses, **kw)} AS BLOB)), 0)"


LEDGER_TABLES = ("runs", "attempts", "outbox", "delivery_attempts", "occurrences")


@dataclass(frozen=True)
class Storage:
    """The space the ledger's tables take, as the database reports it: PostgreSQL, their
    total relation size (with indexes and TOAST); SQLite, the database file's pages, and of
    them the free pages (``free_bytes``: space SQLite reuses before growing the file)."""

    total_bytes: int
    free_bytes: int | None


def ledger_storage(conn: Connection) -> Storage:
    """The ledger tables' size now (an operator read, not a named statement: no parameters,
    catalog functions)."""
    if conn.dialect.name == "postgresql":
        total = conn.exec_driver_sql(
            "SELECT " + " + ".join(f"pg_total_relation_size('{t}')" for t in LEDGER_TABLES)
        ).scalar_one()
        return Storage(int(total), None)
    pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
    free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
    size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
    return Storage(int(pages) * int(size), int(free) * int(size))


def vacuum(conn: Connection) -> None:
    """PostgreSQL: a plain VACUUM of the ledger tables, in autocommit: the space of deleted
    rows and nulled documents becomes reusable by new rows (no exclusive lock; the files are
    not shrunk). SQLite: nothing (its freed pages are on the freelist already; shrinking the
    file takes a full VACUUM, which locks the database while it copies it)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("VACUUM " + ", ".join(LEDGER_TABLES))


# Straight on the driver: exec_driver_sql's full execution path cost each SQLite write
# transaction about 15 us of client CPU, a tenth of a completion's.
BEGIN_IMMEDIATE = Statement(
    "begin_write", "A SQLite write transaction takes the write lock up front, so that it waits "
    "its turn instead of failing half-way with 'database is locked'.",
    lambda _dialect: sa.text("BEGIN IMMEDIATE"), dialects=("sqlite",))


