"""Everything that differs between PostgreSQL and SQLite lives here: the database clock,
write locking (BEGIN IMMEDIATE / SKIP LOCKED), upserts and engine set-up."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

from store.errors import InvalidInput, LedgerBusy
from store.models import UTCDateTime

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 5_000
SQLITE_LOCKED_RETRIES = 8
READ_ONLY = "runledger_read_only"


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
    if not args:
        return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    shift = compiler.process(args[0], **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', {shift}))"


def seconds(value: float, name: str = "seconds") -> ColumnElement[Any]:
    """A bound, validated duration in seconds for ``db_now(seconds(...))``."""
    if value < 0 or value != value:
        raise InvalidInput(f"{name} must be a non-negative number of seconds, got {value!r}")
    return sa.literal(float(value), sa.Float())


def insert_ignoring_conflicts(conn: Connection, table: sa.Table) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING (any unique constraint) for the dialect of ``conn``."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def create_engine(url: str) -> Engine:
    """An engine for a PostgreSQL (psycopg 3) or SQLite URL, set up for the ledger."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return sa.create_engine(parsed, pool_pre_ping=True, pool_size=5, max_overflow=10)
    if parsed.get_backend_name() != "sqlite":
        raise InvalidInput(f"unsupported database URL {url!r}: use postgresql+psycopg:// or sqlite:///")
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Driver-level autocommit so that SQLAlchemy's "begin" below decides how writes lock.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(READ_ONLY):
            return  # reads run in SQLite's autocommit mode and never wait for the write lock
        # Take the write lock up front: a deferred transaction that reads and then writes can
        # fail with "database is locked" half-way instead of waiting its turn.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _is_locked(exc: OperationalError) -> bool:
    text = str(exc.orig).lower()
    return "database is locked" in text or "database is busy" in text


@contextmanager
def _transaction(engine: Engine) -> Iterator[Connection]:
    with engine.begin() as conn:
        yield conn


def run_write(engine: Engine, work: Callable[[Connection], T], *, autocommit: bool = False) -> T:
    """Run ``work`` in one write transaction and commit it; the caller owns nothing else.

    ``autocommit`` (PostgreSQL) sends a single-statement transition in one round trip.
    On SQLite, "database is locked" is retried a bounded number of times, then raised as
    ``LedgerBusy``: a locked database is never taken for a win."""
    if autocommit and engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return work(conn)
    for attempt in range(SQLITE_LOCKED_RETRIES + 1):
        try:
            with _transaction(engine) as conn:
                return work(conn)
        except OperationalError as exc:
            if engine.dialect.name != "sqlite" or not _is_locked(exc):
                raise
            if attempt == SQLITE_LOCKED_RETRIES:
                raise LedgerBusy(
                    f"the SQLite ledger stayed locked after {SQLITE_LOCKED_RETRIES + 1} tries "
                    f"of {SQLITE_BUSY_TIMEOUT_MS} ms; nothing was written"
                ) from exc
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise AssertionError("unreachable")


def run_read(engine: Engine, work: Callable[[Connection], T]) -> T:
    """Run a read-only ``work`` without taking the write lock."""
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        return work(conn)
