"""Named statements: every SQL statement the ledger sends has a name and the one-line rule it
keeps, is built with SQLAlchemy Core, compiled once per dialect, and run straight on the driver
connection. ``store.catalogue`` writes what each compiles to into ``store/sql/<dialect>.sql``,
the file to read to audit the ledger.

Why: for these one-row statements SQLAlchemy's per-execution machinery (statement construction,
execution context, result wrapping) costs more CPU than the database round trip itself; a
prepared transition runs close to a raw driver call (see bench/ledger_bench.py). Types still
convert through SQLAlchemy's own bind and result processors, and driver errors come out as
SQLAlchemy's exceptions, with a dropped connection invalidated like SQLAlchemy does."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.elements import ClauseElement

Processor = Callable[[Any], Any] | None
DIALECTS = ("postgresql", "sqlite")


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


def param(column: sa.Column[Any], name: str | None = None) -> sa.BindParameter[Any]:
    """A parameter named after ``column`` (or ``name``) with the column's type."""
    return sa.bindparam(name or column.key, type_=column.type)


def optional(column: sa.Column[Any]) -> sa.ColumnElement[bool]:
    """``column`` equals its parameter, or the parameter is NULL (no filter)."""
    given = sa.cast(param(column), column.type)
    return sa.or_(given.is_(None), column == given)


def one_of(column: sa.Column[Any], values: tuple[str, ...]) -> sa.ColumnElement[bool]:
    """``column`` is one of ``values``, written out (a statement binds no list parameter)."""
    return sa.or_(*(column == value for value in values))


InsertT = TypeVar("InsertT", bound=sa.Insert)


def insert_rows(insert: InsertT, names: Sequence[str], rows: sa.Select[Any]) -> InsertT:
    """``insert`` fills ``names`` from ``rows``, each selected expression labelled by the column
    it fills (so the catalogue reads ``0 AS attempts``, not ``anon_1``)."""
    labelled = [c if getattr(c, "name", None) == n else c.label(n)
                for n, c in zip(names, rows.selected_columns, strict=True)]
    return insert.from_select(names, rows.with_only_columns(*labelled))


P = ParamSpec("P")
R = TypeVar("R")
STATEMENTS: dict[str, Statement] = {}  # every named statement, in the order defined
# Where a transition sends one statement and nothing else, and so runs in autocommit: no
# BEGIN/COMMIT round trips on PostgreSQL; on SQLite the statement takes the write lock itself.
EVERYWHERE = frozenset(DIALECTS)
ON_POSTGRES = frozenset({"postgresql"})
NOWHERE: frozenset[str] = frozenset()


class Transition(Generic[P, R]):
    """A state transition: a function of an open connection that never commits (the caller
    owns the transaction), and the dialects where it is one statement (``one_statement_on``);
    a transition whose statements depend on its arguments says when it is one (``when``)."""

    def __init__(self, function: Callable[Concatenate[Connection, P], R],
                 one_statement_on: frozenset[str],
                 when: Callable[..., bool] | None = None) -> None:
        self.function = function
        self.one_statement_on = one_statement_on
        self.when = when
        self.__name__ = function.__name__
        self.__doc__ = function.__doc__

    def __call__(self, conn: Connection, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(conn, *args, **kwargs)

    def is_one_statement(self, dialect: str, *args: P.args, **kwargs: P.kwargs) -> bool:
        """Whether this call of the transition sends one statement on ``dialect``."""
        return dialect in self.one_statement_on and (self.when is None or self.when(*args, **kwargs))


def transition(*, one_statement_on: frozenset[str], when: Callable[..., bool] | None = None
               ) -> Callable[[Callable[Concatenate[Connection, P], R]], Transition[P, R]]:
    """Declare a function a transition, one statement in autocommit on ``one_statement_on``
    (for the calls ``when`` holds for, its arguments given, if given)."""
    def declare(function: Callable[Concatenate[Connection, P], R]) -> Transition[P, R]:
        return Transition(function, one_statement_on, when)

    return declare


class Statement:
    """One named statement and the rule it keeps, built lazily per dialect by
    ``build(dialect_name)`` and compiled once; ``dialects`` names where it is sent (a
    follow-up that PostgreSQL folds into one statement is sent on its own on SQLite only)."""

    def __init__(self, name: str, rule: str, build: Callable[[str], ClauseElement], *,
                 dialects: tuple[str, ...] = DIALECTS) -> None:
        if name in STATEMENTS:
            raise ValueError(f"a statement named {name!r} already exists")
        self.name = name
        self.rule = rule
        self.dialects = dialects
        self._build = build
        self._compiled: dict[str, _Compiled] = {}
        STATEMENTS[name] = self

    def build(self, dialect_name: str) -> ClauseElement:
        """The statement as built for ``dialect_name``: what runs and what the catalogue shows
        are compiled from it."""
        return self._build(dialect_name)

    def __repr__(self) -> str:
        return f"Statement({self.name!r})"

    def compiled(self, dialect: Dialect) -> _Compiled:
        found = self._compiled.get(dialect.name)
        if found is None:
            found = self._compiled[dialect.name] = _compile(self.build(dialect.name), dialect)
        return found

    def rows(self, conn: Connection, **params: Any) -> list[dict[str, Any]]:
        """Execute on ``conn``'s driver connection (inside whatever transaction it has) and
        return the returned rows as dicts keyed by column name."""
        c = self.compiled(conn.dialect)
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
