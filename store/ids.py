"""Run and outbox message ids by prefix: people type the first characters of an id, as git
takes a commit's; the CLI shows short ids."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.errors import AmbiguousId, InvalidInput, MessageNotFound, RunledgerError, RunNotFound
from store.models import outbox_table, runs_table
from store.statement import Statement, param

ID_CHARS = 64  # a Run or message id: sha256 as lowercase hex
MIN_ID_PREFIX = 4
SHOWN_CANDIDATES = 5
_HEX = frozenset("0123456789abcdef")


def _starting_with(column: sa.Column[Any]) -> sa.Select[Any]:
    # Every id has 64 hex characters, so those starting with the prefix are exactly the range
    # from it padded with 0s to it padded with fs: the primary key's index serves that range
    # under any collation, where LIKE 'abc%' needs the C collation on PostgreSQL.
    return (sa.select(column.label("id"), sa.func.count().over().label("matches"))
            .where(column.between(param(column, "low"), param(column, "high")))
            .order_by(column).limit(SHOWN_CANDIDATES))


_RUN_IDS = Statement("find_run_ids", "The first Run ids in the range a prefix spans, and how "
                     "many there are.", lambda d: _starting_with(runs_table.c.run_id))
_MESSAGE_IDS = Statement("find_message_ids", "The first outbox message ids in the range a "
                         "prefix spans, and how many there are.",
                         lambda d: _starting_with(outbox_table.c.message_id))


def _resolve(conn: Connection, statement: Statement, text: str, what: str,
             missing: type[RunledgerError]) -> str:
    prefix = text.strip().lower()
    if not prefix or len(prefix) > ID_CHARS or not set(prefix) <= _HEX:
        raise InvalidInput(f"{what} id {text!r} is not an id: give the id or its first "
                           f"characters (0-9, a-f, at most {ID_CHARS})")
    if len(prefix) < MIN_ID_PREFIX:
        raise InvalidInput(f"{what} id {text!r} is too short: give at least {MIN_ID_PREFIX} of "
                           "its characters")
    rows = statement.rows(conn, low=prefix.ljust(ID_CHARS, "0"), high=prefix.ljust(ID_CHARS, "f"))
    if not rows:
        which = "id" if len(prefix) == ID_CHARS else "an id starting"
        raise missing(f"no {what} with {which} {prefix!r}")
    matches = rows[0]["matches"]
    if matches > 1:
        shown = ", ".join(row["id"][: max(16, len(prefix) + 4)] for row in rows)
        more = ", ..." if matches > len(rows) else ""
        raise AmbiguousId(f"{what} id {prefix!r} is ambiguous: {matches} {what}s start "
                          f"with it ({shown}{more}); give more of its characters")
    return str(rows[0]["id"])


def resolve_run_id(conn: Connection, text: str) -> str:
    """The one Run id starting with ``text`` (the id, or at least its first MIN_ID_PREFIX hex
    characters); ``RunNotFound`` when none does, ``AmbiguousId`` naming them when several do."""
    return _resolve(conn, _RUN_IDS, text, "run", RunNotFound)


def resolve_message_id(conn: Connection, text: str) -> str:
    """The one outbox message id starting with ``text`` (as ``resolve_run_id``)."""
    return _resolve(conn, _MESSAGE_IDS, text, "outbox message", MessageNotFound)
