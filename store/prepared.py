"""Prepared statements: each ledger transition's statement is built with SQLAlchemy Core once,
compiled once per dialect, and then run straight on the driver connection.

Why: for these one-row statements SQLAlchemy's per-execution machinery (statement construction,
execution context, result wrapping) costs more CPU than the database round trip itself; a
prepared transition runs close to a raw driver call (see bench/ledger_bench.py). Types still
convert through SQLAlchemy's own bind and result processors, and driver errors come out as
SQLAlchemy's exceptions, with a dropped connection invalidated like SQLAlchemy does."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exc
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.elements import ClauseElement

Processor = Callable[[Any], Any] | None


@dataclass(frozen=True)
class _Compiled:
    sql: str
    order: tuple[str, ...] | None  # parameter order for positional drivers (sqlite3)
    defaults: Mapping[str, Any]  # values bound inside the statement (literals)
    binds: Mapping[str, Processor]
    keys: tuple[str, ...]
    results: tuple[Processor, ...]


def _compile(statement: ClauseElement, dialect: Dialect) -> _Compiled:
    compiled = statement.compile(dialect=dialect)
    params = {name: bind for bind, name in compiled.bind_names.items()}  # type: ignore[attr-defined]
    if any(bind.expanding for bind in params.values()):
        raise TypeError("a prepared statement cannot use IN with an expanding list parameter")
    returned = list(getattr(statement, "exported_columns", ()))
    return _Compiled(
        sql=str(compiled),
        order=tuple(compiled.positiontup) if compiled.positiontup else None,  # type: ignore[attr-defined]
        defaults={n: b.effective_value for n, b in params.items() if not b.required},
        binds={n: b.type.dialect_impl(dialect).bind_processor(dialect) for n, b in params.items()},
        keys=tuple(c.key for c in returned),
        results=tuple(c.type.dialect_impl(dialect).result_processor(dialect, None) for c in returned),
    )


class Prepared:
    """One statement, built lazily per dialect by ``build(dialect_name)`` and compiled once."""

    def __init__(self, build: Callable[[str], ClauseElement]) -> None:
        self._build = build
        self._compiled: dict[str, _Compiled] = {}

    def _for(self, dialect: Dialect) -> _Compiled:
        found = self._compiled.get(dialect.name)
        if found is None:
            found = self._compiled[dialect.name] = _compile(self._build(dialect.name), dialect)
        return found

    def rows(self, conn: Connection, **params: Any) -> list[dict[str, Any]]:
        """Execute on ``conn``'s driver connection (inside whatever transaction it has) and
        return the returned rows as dicts keyed by column name."""
        c = self._for(conn.dialect)
        values: dict[str, Any] = {}
        for name, process in c.binds.items():
            value = params[name] if name in params else c.defaults[name]
            values[name] = process(value) if process is not None else value
        args: Any = tuple(values[n] for n in c.order) if c.order is not None else values
        dbapi_conn = conn.connection.dbapi_connection
        cursor = dbapi_conn.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(c.sql, args)
            fetched = cursor.fetchall() if c.keys else []
        except conn.dialect.loaded_dbapi.Error as error:
            dropped = conn.dialect.is_disconnect(error, dbapi_conn, cursor)
            if dropped:
                conn.invalidate(error)
            raise exc.DBAPIError.instance(
                c.sql, args, error, conn.dialect.loaded_dbapi.Error, connection_invalidated=dropped
            ) from error
        finally:
            cursor.close()
        return [
            {k: (p(v) if p is not None else v) for k, p, v in zip(c.keys, c.results, row, strict=True)}
            for row in fetched
        ]

    def first(self, conn: Connection, **params: Any) -> dict[str, Any] | None:
        found = self.rows(conn, **params)
        return found[0] if found else None
