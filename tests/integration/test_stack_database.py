"""A PostgreSQL stack gives Prefect its own database next to the ledger's, created on first start."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from flows.stack.config import prefect_database_for
from store import InvalidInput
from store.database import create_database_if_missing

pytestmark = pytest.mark.postgres


def database_exists(admin_url: str, name: str) -> bool:
    engine = sa.create_engine(admin_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                {"n": name}).first() is not None
    finally:
        engine.dispose()


def test_prefects_database_next_to_a_postgresql_ledger_is_created_once(postgres_databases: Any) -> None:
    postgres_admin_url = postgres_databases.url("postgres")
    ledger_url = sa.engine.make_url(postgres_admin_url).set(
        database=f"rltest_stack_{uuid.uuid4().hex[:8]}").render_as_string(False)
    prefect_url = prefect_database_for(ledger_url, None)
    assert prefect_url is not None
    name = sa.engine.make_url(prefect_url).database
    assert name is not None and name.endswith("_prefect")
    try:
        assert create_database_if_missing(prefect_url) is True
        assert database_exists(postgres_admin_url, name)
        assert create_database_if_missing(prefect_url) is False
    finally:
        admin = sa.create_engine(postgres_admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def test_only_a_postgresql_url_names_a_database_to_create() -> None:
    with pytest.raises(InvalidInput, match="not a PostgreSQL database URL"):
        create_database_if_missing("sqlite:////tmp/ledger.db")
