"""Connection management: the ledger's engines, the connections each process keeps, how a
writer waits for a lock (``Busy``) and retries, and where statement errors become runledger's.
What differs in the SQL itself lives in ``store.dialect``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import psycopg
import psycopg.sql
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from store.dialect import BEGIN_IMMEDIATE, db_now
from store.driver_errors import domain_errors, is_locked
from store.errors import InvalidInput, LedgerBusy
from store.statement import Statement

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 5_000
SQLITE_LOCKED_RETRIES = 8
POSTGRES_LOCK_TIMEOUT_MS = 10_000
READ_ONLY = "runledger_read_only"
# SQLite's WAL commit modes: "full" syncs the WAL before a commit returns, "normal" only at
# checkpoints: a power cut or OS crash (not a process crash) can then roll back the last
# commits. "normal" by default, the mode SQLite advises for WAL: "full" halves the ledger's
# write throughput here (docs/benchmarks.md), and a host whose ledger must survive a power
# cut commit by commit is better served by PostgreSQL.
SQLiteSynchronous = Literal["full", "normal"]
SQLITE_SYNCHRONOUS: SQLiteSynchronous = "normal"
IDLE_PING_SECONDS = 30.0  # a pooled connection idle longer than this is pinged before use
# Each engine's pool holds POOL_SIZE connections plus POOL_OVERFLOW more under load; the kept
# connections may take all but POOL_HEADROOM of them, which stay for callers that check one out
# and give it back (reads on SQLite, migrations, operator tools).
POOL_SIZE = 5
POOL_OVERFLOW = 10
POOL_HEADROOM = 5
KEPT_CONNECTIONS = POOL_SIZE + POOL_OVERFLOW - POOL_HEADROOM
KEPT_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class Busy:
    """How long a writer waits for a lock before the ledger reports ``LedgerBusy``: SQLite's
    write lock, ``timeout_ms`` per try and ``retries`` more tries, after waiting up to
    ``turn_seconds`` for the other writers of its own process; a PostgreSQL lock (a Run row
    held by a transaction that does not end, a table locked by an operator's DDL),
    ``postgres_lock_timeout_ms`` once (0: wait without limit, PostgreSQL's default)."""

    timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS
    retries: int = SQLITE_LOCKED_RETRIES
    postgres_lock_timeout_ms: int = POSTGRES_LOCK_TIMEOUT_MS
    turn_seconds: float = KEPT_WAIT_SECONDS

    def __post_init__(self) -> None:
        if min(self.timeout_ms, self.retries, self.postgres_lock_timeout_ms,
               self.turn_seconds) < 0:
            raise InvalidInput(f"busy timeouts and retries must not be negative, got {self}")


DEFAULT_BUSY = Busy()


@dataclass(frozen=True)
class Reach:
    """How soon a connection to a PostgreSQL server that stopped answering (its host gone, a
    link cut without a reset) fails instead of waiting for ever: ``connect_timeout_s`` for a
    new connection; for an open one, TCP keepalives (a probe after ``keepalives_idle_s`` of
    silence, every ``keepalives_interval_s``, ``keepalives_count`` unanswered ones) and
    ``tcp_user_timeout_ms`` for what it sent that stays unacknowledged (0: the system's
    defaults). Without them a lease renewal sent over a cut link waits for the kernel's
    retransmissions, about 15 minutes, while its lease expires and another worker takes over.
    libpq parameters given in the URL's query win."""

    connect_timeout_s: int = 10
    keepalives_idle_s: int = 5
    keepalives_interval_s: int = 2
    keepalives_count: int = 3
    tcp_user_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        if min(self.connect_timeout_s, self.keepalives_idle_s, self.keepalives_interval_s,
               self.keepalives_count, self.tcp_user_timeout_ms) < 0:
            raise InvalidInput(f"PostgreSQL client timeouts must not be negative, got {self}")

    def libpq(self) -> dict[str, int]:
        """The libpq connection parameters (0 leaves one at libpq's or the system's default)."""
        chosen = {"connect_timeout": self.connect_timeout_s,
                  "keepalives_idle": self.keepalives_idle_s,
                  "keepalives_interval": self.keepalives_interval_s,
                  "keepalives_count": self.keepalives_count,
                  "tcp_user_timeout": self.tcp_user_timeout_ms}
        return {"keepalives": 1, **{k: v for k, v in chosen.items() if v > 0}}


DEFAULT_REACH = Reach()


def _postgres_engine(url: sa.URL, busy: Busy, reach: Reach, **options: Any) -> Engine:
    # lock_timeout as a start-up option: set with the connection, no extra round trip; a
    # libpq ``options`` given in the URL is kept.
    given = url.query.get("options", "")
    startup = " ".join([*([given] if isinstance(given, str) else given),
                        f"-c lock_timeout={int(busy.postgres_lock_timeout_ms)}"]).strip()
    # Positional parameters: psycopg binds a tuple with less work than a dict of names.
    timeouts = {k: v for k, v in reach.libpq().items() if k not in url.query}
    engine = sa.create_engine(url, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW,
                              paramstyle="format",
                              connect_args={"options": startup, **timeouts}, **options)

    # Pessimistic disconnect handling only for connections that sat idle in the pool: pinging
    # on every checkout would double the round trips of a one-statement transition.
    @sa.event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("idle_since", time.monotonic()) < IDLE_PING_SECONDS:
            return
        try:
            dbapi_conn.execute("SELECT 1")
            if not dbapi_conn.autocommit:
                dbapi_conn.rollback()
        except psycopg.Error as exc:
            raise sa.exc.DisconnectionError(f"pooled connection is dead: {exc}") from exc

    return engine


def _sqlite_engine(url: sa.URL, busy: Busy, synchronous: SQLiteSynchronous) -> Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW,
                              connect_args={"timeout": busy.timeout_ms / 1000})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Driver-level autocommit so that SQLAlchemy's "begin" below decides how writes lock.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy.timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(READ_ONLY):
            return  # reads run in SQLite's autocommit mode and never wait for the write lock
        # Take the write lock up front: a deferred transaction that reads and then writes can
        # fail with "database is locked" half-way instead of waiting its turn.
        BEGIN_IMMEDIATE.rows(conn)

    return engine


def create_database_if_missing(url: str) -> bool:
    """Create the PostgreSQL database that ``url`` names, connecting to the server's
    ``postgres`` database with the same credentials; False if it already exists."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "postgresql" or not parsed.database:
        raise InvalidInput(f"not a PostgreSQL database URL: {parsed.render_as_string()}")
    name = parsed.database
    with domain_errors(POSTGRES_LOCK_TIMEOUT_MS):
        return _create_database(parsed, name)


def _create_database(parsed: sa.URL, name: str) -> bool:
    admin = sa.create_engine(
        parsed.set(drivername="postgresql+psycopg", database="postgres"),
        isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool,
    )
    try:
        with admin.connect() as conn:
            found = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :name"),
                                 {"name": name}).first()
            if found:
                return False
            driver = conn.connection.dbapi_connection
            try:
                driver.execute(  # type: ignore[union-attr]
                    psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                return False  # created by another process since our check
            return True
    finally:
        admin.dispose()


class _KeptConnections:
    """Connections kept checked out between units of work and reused last-in first-out: a
    transition then costs a list pop and append instead of a pool checkout, a new Connection
    object and a pool checkin (about a sixth of a PostgreSQL transition's client CPU).

    Each connection serves one thread at a time. At most ``KEPT_CONNECTIONS`` exist: a thread
    that finds them all busy waits here for one to come back, never in the pool, to which a kept
    connection does not return. A server connection idle longer than ``IDLE_PING_SECONDS`` is
    pinged first; one that failed with a dropped connection, or was interrupted mid-statement,
    is discarded and frees its place."""

    def __init__(self, engine: Engine, *, ping: bool, limit: int = KEPT_CONNECTIONS,
                 wait_seconds: float = KEPT_WAIT_SECONDS) -> None:
        self.engine = engine
        self.ping = ping
        self.limit = limit
        self.wait_seconds = wait_seconds
        self.opened = 0
        self._idle: list[tuple[Connection, float]] = []
        self._returned = threading.Condition()

    def _idle_or_place(self) -> tuple[Connection, float] | None:
        """An idle connection, or None when there is room to open one (the place is taken)."""
        with self._returned:
            if not self._returned.wait_for(lambda: self._idle or self.opened < self.limit,
                                           self.wait_seconds):
                raise LedgerBusy(
                    f"all {self.limit} ledger connections of this process stayed in use for "
                    f"{self.wait_seconds:.0f} s: nothing was written, retry later"
                )
            if self._idle:
                return self._idle.pop()
            self.opened += 1
            return None

    def _discard(self, conn: Connection | None) -> None:
        if conn is not None and not conn.closed:
            conn.invalidate()
            conn.close()
        with self._returned:
            self.opened -= 1
            self._returned.notify()

    def _take(self) -> Connection:
        while True:
            kept = self._idle_or_place()
            if kept is None:
                try:
                    return self.engine.connect()
                except BaseException:
                    self._discard(None)
                    raise
            conn, since = kept
            if not self.ping or time.monotonic() - since < IDLE_PING_SECONDS:
                return conn
            try:
                conn.exec_driver_sql("SELECT 1")
                conn.rollback()
                return conn
            except Exception:  # dropped by the server, or unusable here: open another
                self._discard(conn)
            except BaseException:
                self._discard(conn)
                raise

    def run(self, work: Callable[[Connection], T]) -> T:
        conn = self._take()
        try:
            result = work(conn)
        except Exception:
            self._release(conn)
            raise
        except BaseException:
            self._discard(conn)  # interrupted inside a statement: its state is unknown
            raise
        self._release(conn)
        return result

    def _release(self, conn: Connection) -> None:
        if conn.invalidated:
            self._discard(conn)
            return
        if conn.in_transaction():
            conn.rollback()  # in autocommit only SQLAlchemy's bookkeeping: no round trip
        with self._returned:
            self._idle.append((conn, time.monotonic()))
            self._returned.notify()

    def close(self) -> None:
        with self._returned:
            idle, self._idle = self._idle, []
            self.opened -= len(idle)
        for conn, _ in idle:
            conn.close()
        self.engine.dispose()


# One lock per SQLite file for the writers of this process. SQLite's busy handler polls the
# write lock with sleeps of 1 ms growing to 100 ms, so threads of one process that met at it
# slept far longer than it was held (timed around each write in the pipeline benchmark with
# 8 subject threads: 8.5 ms at the median and up to 0.46 s, against 0.3 ms holding the lock);
# a thread lock wakes the next writer as soon as the last one is done. Writers in other
# processes still meet at SQLite's lock.
_sqlite_writers: dict[str, threading.Lock] = {}
_sqlite_writers_guard = threading.Lock()


def _sqlite_writer(url: sa.URL) -> threading.Lock:
    """This process's writer lock for the SQLite database at ``url``."""
    name = url.database or ""
    if name in ("", ":memory:") or name.startswith("file:"):
        return threading.Lock()  # a private or URI-named database: no file to share a lock on
    key = os.path.realpath(os.path.expanduser(name))
    with _sqlite_writers_guard:
        return _sqlite_writers.setdefault(key, threading.Lock())


def _in_transaction(work: Callable[[Connection], T]) -> Callable[[Connection], T]:
    def transact(conn: Connection) -> T:
        with conn.begin():
            return work(conn)

    return transact


_CLOCK = Statement("read_clock", "The database clock, which every lease and due time is judged by.",
                   lambda d: sa.select(db_now().label("now")))


class Database:
    """The ledger's connections to one PostgreSQL (psycopg 3) or SQLite database.

    Writes run as transactions on kept connections (on SQLite each one ``BEGIN IMMEDIATE``); on
    PostgreSQL kept autocommit connections send a one-statement transition, or a read, in one
    round trip. ``engine`` is the transactional engine, for migrations and tools."""

    def __init__(self, url: str, busy: Busy = DEFAULT_BUSY,
                 sqlite_synchronous: SQLiteSynchronous = SQLITE_SYNCHRONOUS,
                 reach: Reach = DEFAULT_REACH) -> None:
        if sqlite_synchronous not in get_args(SQLiteSynchronous):
            modes = " or ".join(repr(m) for m in get_args(SQLiteSynchronous))
            raise InvalidInput(f"sqlite_synchronous must be {modes}, got {sqlite_synchronous!r}")
        parsed = sa.engine.make_url(url)
        self.busy = busy
        self.autocommit: _KeptConnections | None = None
        self._writer: threading.Lock | None = None
        if parsed.get_backend_name() == "postgresql":
            if parsed.drivername == "postgresql":
                parsed = parsed.set(drivername="postgresql+psycopg")
            self.engine = _postgres_engine(parsed, busy, reach)
            self.autocommit = _KeptConnections(
                _postgres_engine(parsed, busy, reach, isolation_level="AUTOCOMMIT"), ping=True
            )
        elif parsed.get_backend_name() == "sqlite":
            self.engine = _sqlite_engine(parsed, busy, sqlite_synchronous)
            self._writer = _sqlite_writer(parsed)
        else:
            raise InvalidInput(
                f"unsupported database URL {url!r}: use postgresql+psycopg:// or sqlite:///"
            )
        self.transactional = _KeptConnections(self.engine, ping=self.autocommit is not None)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def dispose(self) -> None:
        self.transactional.close()
        if self.autocommit is not None:
            self.autocommit.close()

    def write(self, work: Callable[[Connection], T], *, single_statement: bool = False) -> T:
        """Run ``work`` in one write transaction and commit it.

        ``single_statement`` work (one guarded statement, or a guarded statement followed only
        by reads) runs in autocommit: on PostgreSQL one round trip, no BEGIN/COMMIT; on SQLite
        the statement takes the write lock itself and holds it only while it runs. On SQLite,
        "database is locked" is retried ``busy.retries`` times, then raised as ``LedgerBusy``:
        a locked database is never taken for a win. The writers of one process take turns
        at a lock of their own first (``_sqlite_writer``)."""
        with domain_errors(self.busy.postgres_lock_timeout_ms):
            if single_statement and self.autocommit is not None:
                return self.autocommit.run(work)
            # The kept SQLite connections are in driver autocommit until a transaction begins.
            unit = work if single_statement else _in_transaction(work)
            with self._writer_turn():
                return self._write_retrying(unit)

    @contextmanager
    def _writer_turn(self) -> Iterator[None]:
        """Wait up to ``busy.turn_seconds`` for this process's other writers of the same SQLite
        file (PostgreSQL: no wait here, its writers lock rows, not the database)."""
        if self._writer is None:
            yield
            return
        if not self._writer.acquire(timeout=self.busy.turn_seconds):
            raise LedgerBusy(
                f"another thread of this process kept writing to the SQLite ledger for "
                f"{self.busy.turn_seconds:g} s: nothing was written, retry later"
            )
        try:
            yield
        finally:
            self._writer.release()

    def _write_retrying(self, unit: Callable[[Connection], T]) -> T:
        """Run ``unit``, trying again while SQLite says the database is locked."""
        for attempt in range(self.busy.retries + 1):
            try:
                return self.transactional.run(unit)
            except OperationalError as exc:
                if self.dialect != "sqlite" or not is_locked(exc):
                    raise
                if attempt == self.busy.retries:
                    raise LedgerBusy(
                        f"the SQLite ledger stayed locked after {self.busy.retries + 1} tries "
                        f"of {self.busy.timeout_ms} ms each; nothing was written, retry later"
                    ) from exc
                time.sleep(min(0.05 * 2**attempt, 1.0))
        raise AssertionError("unreachable")

    def read(self, work: Callable[[Connection], T]) -> T:
        """Run a read-only ``work`` without taking the write lock."""
        with domain_errors(self.busy.postgres_lock_timeout_ms):
            if self.autocommit is not None:
                return self.autocommit.run(work)
            with self.engine.connect().execution_options(**{READ_ONLY: True}) as conn:
                return work(conn)

    def now(self) -> datetime:
        """The database clock (what lease expiry is judged by)."""
        row = self.read(_CLOCK.first)
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]
