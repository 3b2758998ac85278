"""The column types and field helpers the ledger's tables share, and the constraint naming
convention every table is declared under (so import this before declaring a table)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlmodel import Field, SQLModel

from store.errors import InvalidInput
from store.identity import require_aware

SQLModel.metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Timestamps are stored in UTC and always come back timezone-aware (SQLite forgets zones)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        utc = require_aware(value, "timestamp", InvalidInput)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Real(sa.types.TypeDecorator[float]):
    """A double-precision float read back as a Python float (psycopg's numeric result
    processor wants a column type code that a prepared statement's processors do not have)."""

    impl = sa.Float()
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        return lambda value: None if value is None else float(value)


JSONDoc = sa.JSON().with_variant(JSONB(), "postgresql")



def ts(nullable: bool = True, **kw: Any) -> Any:
    """A UTC timestamp column (NULL unless ``nullable`` is False)."""
    return Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=nullable, **kw))


def json_doc() -> Any:
    """A nullable JSON document column (JSONB on PostgreSQL)."""
    return Field(default=None, sa_column=sa.Column(JSONDoc, nullable=True))


def count() -> Any:
    """A counter column: 0 for rows that existed before it (the server default)."""
    return Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0"))


def check_in(column: str, values: tuple[str, ...], name: str) -> sa.CheckConstraint:
    """A CHECK that ``column`` holds one of ``values``, named ``name``."""
    listed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({listed})", name=name)
