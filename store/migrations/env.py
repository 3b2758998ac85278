"""Alembic environment: runs on the connection the Ledger passes in (it owns the transaction)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text
from sqlmodel import SQLModel

# Importing the table modules registers their tables on SQLModel.metadata.
import store.call_tables
import store.models  # noqa: F401

MIGRATION_LOCK = 7_340_001  # pg_advisory_xact_lock key: one migrator at a time across hosts

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through Ledger.migrate() or `runledger db upgrade`")

if connection.dialect.name == "postgresql":
    # Concurrent workers may all migrate at start-up; the lock makes the others wait and then
    # find the schema already at head (Alembic reads the version after this point). They wait
    # as long as it takes, not the ledger's lock timeout: a migration may take a while.
    connection.execute(text("SET LOCAL lock_timeout = 0"))
    connection.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
