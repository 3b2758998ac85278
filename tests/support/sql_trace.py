"""What the ledger sends to its database, recorded at the driver: every statement a cursor
executes (psycopg) or SQLite runs (its trace callback), plus PostgreSQL's BEGIN and COMMIT, which
psycopg sends on its own. A statement is one round trip to the server."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.pool import Pool


def _recording(sent: list[str]) -> type[psycopg.Cursor[Any]]:
    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            sent.append(str(query))
            return super().execute(query, params, **kwargs)

    return Recording


@contextmanager
def sent_statements() -> Iterator[list[str]]:
    """Record the SQL of every connection opened inside (open ledgers inside, not before)."""
    sent: list[str] = []

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.set_trace_callback(sent.append)
        else:
            dbapi_conn.cursor_factory = _recording(sent)

    def on_begin(conn: sa.Connection) -> None:
        driver = conn.connection.dbapi_connection
        if isinstance(driver, psycopg.Connection) and not driver.autocommit:
            sent.append("BEGIN")

    def on_commit(conn: sa.Connection) -> None:
        if isinstance(conn.connection.dbapi_connection, psycopg.Connection):
            sent.append("COMMIT")

    sa.event.listen(Pool, "connect", on_connect)
    sa.event.listen(sa.engine.Engine, "begin", on_begin)
    sa.event.listen(sa.engine.Engine, "commit", on_commit)
    try:
        yield sent
    finally:
        sa.event.remove(Pool, "connect", on_connect)
        sa.event.remove(sa.engine.Engine, "begin", on_begin)
        sa.event.remove(sa.engine.Engine, "commit", on_commit)
