"""The schema that the Alembic migrations build is exactly the one the SQLModel models declare,
with the named constraints the ledger relies on, on both dialects."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

from store import Ledger, RunIdentity
from store.models import runs_table


def differences(ledger: Ledger, metadata: sa.MetaData) -> list[Any]:
    with ledger.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def test_migrated_schema_matches_the_models(ledger: Ledger) -> None:
    """Autogenerate finds no difference between the migrated database and the models."""
    assert differences(ledger, SQLModel.metadata) == []


def test_the_comparison_notices_a_model_the_migrations_lack(ledger: Ledger) -> None:
    """The check above can fail: a column missing from the migrations is reported."""
    changed = sa.MetaData(naming_convention=SQLModel.metadata.naming_convention)
    for table in SQLModel.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["runs"].append_column(sa.Column("not_migrated", sa.Integer))
    assert [d[0] for d in differences(ledger, changed)] == ["add_column"]


def test_the_ledger_relies_on_named_unique_and_check_constraints(ledger: Ledger) -> None:
    """One Run per identity, one Attempt per fence, one message per recipient, known statuses."""
    inspector = sa.inspect(ledger.engine)
    uniques = {u["name"] for t in ("runs", "attempts", "outbox") for u in inspector.get_unique_constraints(t)}
    assert {"uq_runs_identity", "uq_attempts_run_fence", "uq_outbox_run_channel_recipient"} <= uniques
    checks = {c["name"] for c in inspector.get_check_constraints("runs")}
    assert {"ck_runs_status", "ck_runs_fence_non_negative"} <= checks


def test_migrating_again_is_a_no_op(ledger: Ledger) -> None:
    """Workers may all migrate at start-up: upgrading an up-to-date ledger changes nothing."""
    ledger.migrate()
    assert differences(ledger, SQLModel.metadata) == []


def test_the_database_itself_refuses_a_second_row_for_one_identity(ledger: Ledger) -> None:
    """Invariant 1 is a unique constraint: even a raw insert of the same identity under another
    id is refused by the database."""
    run = ledger.register(RunIdentity("digest", "team-a", datetime(2026, 11, 29, tzinfo=UTC), "v1"))
    copy = {**run.model_dump(), "run_id": "f" * 64}
    with pytest.raises(sa.exc.IntegrityError), ledger.engine.begin() as conn:
        conn.execute(sa.insert(runs_table).values(**copy))


def test_the_database_refuses_an_unknown_run_status(ledger: Ledger) -> None:
    """The CHECK constraint on status holds even for a raw update."""
    run = ledger.register(RunIdentity("digest", "team-a", datetime(2026, 11, 29, tzinfo=UTC), "v1"))
    with pytest.raises(sa.exc.IntegrityError), ledger.engine.begin() as conn:
        conn.execute(sa.update(runs_table).values(status="finished"))
    assert ledger.get(run.run_id).status == "pending"


def test_no_runs_index_holds_a_column_that_transitions_change(ledger: Ledger) -> None:
    """Claims, input saves and completions change only unindexed columns (and PostgreSQL leaves
    room in each page), so every Run update can stay a HOT update."""
    inspector = sa.inspect(ledger.engine)
    indexed = {c for i in inspector.get_indexes("runs") for c in i["column_names"]}
    indexed |= {c for u in inspector.get_unique_constraints("runs") for c in u["column_names"]}
    changed = {"status", "fence", "owner", "lease_expires_at", "attempts", "raw_input", "output",
               "error", "updated_at", "completed_at", "completed_attempt_id", "model_calls",
               "completed_flow_run_id", "completed_task_run_id"}
    assert indexed & changed == set()
    if ledger.dialect == "postgresql":
        with ledger.engine.connect() as conn:
            options = conn.exec_driver_sql(
                "SELECT reloptions FROM pg_class WHERE relname = 'runs'"
            ).scalar_one()
        assert options == ["fillfactor=60"]


def test_a_ledger_whose_mail_was_tried_upgrades_from_0012_to_the_latest_schema(
        empty_db_url: str) -> None:
    """An outbox message with a delivery attempt, written at 0012: the upgrades that widen the
    statuses a CHECK allows (0013 for messages, 0016 for Runs) keep both rows, and the new
    statuses are allowed after them."""
    with Ledger.connect(empty_db_url) as ledger:
        ledger.migrate("0012")
        identity = RunIdentity("digest", "tried", datetime(2026, 1, 5, 9, tzinfo=UTC), "v1")
        ledger.register(identity)
        now = datetime.now(UTC)
        with ledger.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body, "
                "headers, status, attempts, fence, next_attempt_at, created_at, updated_at) "
                "VALUES (:id, :run, 'email', 'ops@example.com', 'Old', 'Hello', NULL, 'sent', "
                "1, 1, :now, :now, :now)"), {"id": "e" * 64, "run": identity.run_id, "now": now})
            conn.execute(sa.text(
                "INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, "
                "finished_at, outcome) VALUES (:id, 1, 'w:1', :now, :now, 'sent')"),
                {"id": "e" * 64, "now": now})
        ledger.migrate()
        [message] = ledger.outbox.messages()
        assert message.status == "sent"
        with ledger.engine.begin() as conn:
            attempts = conn.execute(sa.text("SELECT count(*) FROM delivery_attempts")).scalar()
            conn.execute(sa.text("UPDATE outbox SET status = 'held'"))
            conn.execute(sa.text("UPDATE runs SET status = 'waiting'"))
        assert attempts == 1
        assert differences(ledger, SQLModel.metadata) == []
