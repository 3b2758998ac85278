"""The least-privilege PostgreSQL role of infra/worker-grants.sql: a worker with only those
grants runs a tick and a delivery pass, and cannot change the schema or delete history."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from deployments.project import PROJECT_ROOT
from flows.mail.sink import Sink
from flows.registry import upgrade_ledger
from store import Ledger
from tests.conftest import ADMIN_URL, PostgresDatabases
from tests.support.delivery import deliver, statuses
from tests.support.pipeline import SUMMARY, Env, outcomes, pipeline_env


def _apply_grants_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apply_grants",
                                                  PROJECT_ROOT / "infra" / "apply_grants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def worker_url(postgres_databases: PostgresDatabases) -> Iterator[tuple[str, str]]:
    """(owner URL, worker URL) of a fresh migrated ledger; the worker is a new LOGIN role
    given infra/worker-grants.sql and nothing else, dropped afterwards."""
    owner_url = postgres_databases.create()
    owner = Ledger.connect(owner_url)
    upgrade_ledger(owner)  # the jobs' own tables too, as `runledger db upgrade` as the owner
    owner.close()
    role = f"rltest_worker_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    try:
        _apply_grants_module().apply_grants(owner_url, role)
        worker = sa.engine.make_url(owner_url).set(username=role, password=None)
        yield owner_url, worker.render_as_string(hide_password=False)
    finally:
        postgres_databases.drop(owner_url)
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()


@pytest.fixture
def env(worker_url: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_api: str) -> Iterator[Env]:
    """The pipeline environment with RUNLEDGER_DATABASE_URL naming the restricted role."""
    owner_url, worker = worker_url
    with pipeline_env(owner_url, tmp_path, monkeypatch) as found:
        monkeypatch.setenv("RUNLEDGER_DATABASE_URL", worker)
        yield found


def test_a_worker_with_only_the_documented_grants_runs_a_tick_and_a_delivery(
        env: Env, worker_url: tuple[str, str]) -> None:
    """A tick of the reference job completes and its emails are sent, all as the worker role;
    `runledger run`'s schema check at head needs no more than those grants either."""
    _, worker = worker_url
    ledger = Ledger.connect(worker)
    try:
        assert "daily-credit" in upgrade_ledger(ledger)  # at head: reads, creates nothing
        state, report = env.run(SUMMARY, ["acme"], "2026-01-05")
        assert state.name == "Completed" and outcomes(report) == {"acme": "new"}
        with Sink() as sink:
            delivered = deliver(ledger, sink)
            assert delivered.counts["sent"] == sink.stats["received"] == 2
        assert statuses(ledger) == {"sent": 2}
        assert ledger.get(env.the_run("acme", "2026-01-05").run_id).status == "completed"
    finally:
        ledger.close()


@pytest.mark.parametrize("statement", [
    "DELETE FROM runs", "DELETE FROM delivery_attempts", "UPDATE delivery_attempts SET attempt = 0",
    "TRUNCATE outbox", "DROP TABLE outbox", "CREATE TABLE intruder (id int)",
    "ALTER TABLE runs ADD COLUMN intruder int", "UPDATE alembic_version SET version_num = 'x'",
])
def test_the_worker_role_cannot_change_the_schema_or_erase_history(
        worker_url: tuple[str, str], statement: str) -> None:
    """Each statement outside a worker's job is refused by PostgreSQL for lack of privilege."""
    _, worker = worker_url
    engine = sa.create_engine(worker, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError,
                                                     match=r"permission denied|must be owner"):
            conn.exec_driver_sql(statement)
    finally:
        engine.dispose()
