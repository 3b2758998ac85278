"""One acceptance stack per session (a real Prefect server on PostgreSQL with its events
through Redis, two workers, the sink,
a PostgreSQL ledger), on ports of its own; see tests/support/stack.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.support.prefect_server import redis_db
from tests.support.stack import AcceptanceStack, acceptance_stack


@pytest.fixture(scope="session")
def stack(postgres_databases, tmp_path_factory: pytest.TempPathFactory  # type: ignore[no-untyped-def]
          ) -> Iterator[AcceptanceStack]:
    """The running stack; every process it started is stopped when the session ends."""
    ledger_url = postgres_databases.create()

    def prefect_db_url(name: str) -> str:
        url = sa.engine.make_url(postgres_databases.url(name))
        return url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)

    try:
        # The server's events through Redis: under the whole suite's load its in-memory queues
        # once lost a tick's completion events.
        with redis_db() as redis_url, acceptance_stack(
                tmp_path_factory.mktemp("acceptance"), postgres_databases.engine, ledger_url,
                prefect_db_url, redis_url) as started:
            yield started
    finally:
        postgres_databases.drop(ledger_url)
