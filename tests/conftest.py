"""Shared fixtures: every ledger test runs on a fresh SQLite file AND a fresh PostgreSQL database.

Both are copies of a ledger migrated once per session (a file copied, a database cloned from a
template). When PostgreSQL is unreachable the tests are skipped locally, but FAIL when
RUNLEDGER_REQUIRE_POSTGRES=1 (CI)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from store import Ledger

# Prefect reads its settings when first imported: give the whole session a throwaway home
# (never the developer's ~/.prefect), servers that do not phone home, and a start-up timeout
# that a busy machine can meet.
PREFECT_HOME = tempfile.mkdtemp(prefix="runledger-prefect-home-")
atexit.register(shutil.rmtree, PREFECT_HOME, True)
os.environ["PREFECT_HOME"] = PREFECT_HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

ADMIN_URL = os.environ.get(
    "RUNLEDGER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REQUIRE_POSTGRES = os.environ.get("RUNLEDGER_REQUIRE_POSTGRES") == "1"
DIALECTS = ["sqlite", "postgres"]
TESTS = Path(__file__).parent
LAYERS = ("unit", "integration", "acceptance")
DIALECT_FIXTURES = ("db_url", "empty_db_url")


# One pytest-xdist worker runs each group: the acceptance tests on the shared stack (the
# ``stack`` fixture, so that it starts once) and the host drills (so two clusters never compete
# for the two cores). The acceptance tests that start stacks of their own run on any worker.
XDIST_GROUPS = ("acceptance", "hosts")
SHARED_STACK = "stack"


def xdist_group(item: pytest.Item) -> str | None:
    """The xdist group of a test: its layer's, for a host test or an acceptance test on the
    shared stack; None for any other."""
    layer = item.path.relative_to(TESTS).parts[0]
    if layer == "acceptance" and SHARED_STACK not in getattr(item, "fixturenames", ()):
        return None
    return layer if layer in XDIST_GROUPS else None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Put each test of a group in it as it is collected: ``--dist loadgroup`` reads the group
    before any ``pytest_collection_modifyitems`` runs."""
    group = xdist_group(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its layer (its folder under tests/), and with ``postgres`` when it
    uses the PostgreSQL server: through ``postgres_databases``, or a dialect fixture's
    ``postgres`` parameter (given by the fixture or by an indirect parametrize)."""
    for item in items:
        layer = item.path.relative_to(TESTS).parts[0]
        if layer in LAYERS:
            item.add_marker(layer)
        callspec: Any = getattr(item, "callspec", None)
        params: dict[str, Any] = callspec.params if callspec is not None else {}
        if "postgres_databases" in getattr(item, "fixturenames", ()) or any(
                params.get(name) == "postgres" for name in DIALECT_FIXTURES):
            item.add_marker(pytest.mark.postgres)


def _admin() -> sa.Engine:
    return sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT", pool_size=1)


class PostgresDatabases:
    """Creates databases cloned from one migrated template, and drops them afterwards."""

    def __init__(self) -> None:
        self.engine = _admin()
        self.prefix = f"rltest_{uuid.uuid4().hex[:8]}"
        self.template = f"{self.prefix}_template"
        self.created: list[str] = []
        with self.engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.template}"')
        ledger = Ledger.connect(self.url(self.template))
        ledger.migrate()
        ledger.close()

    def url(self, name: str) -> str:
        return str(sa.engine.make_url(ADMIN_URL).set(database=name).render_as_string(False))

    def create(self, migrated: bool = True) -> str:
        name = f"{self.prefix}_{len(self.created)}_{uuid.uuid4().hex[:6]}"
        template = f' TEMPLATE "{self.template}"' if migrated else ""
        with self.engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"{template}')
        self.created.append(name)
        return self.url(name)

    def hold(self, url: str, statement: str) -> psycopg.Connection[Any]:
        """Another session on ``url`` that took a lock with ``statement`` and keeps its
        transaction open (an operator's migration, a stuck effect) until rolled back."""
        libpq = sa.engine.make_url(url).set(drivername="postgresql").render_as_string(False)
        holder = psycopg.connect(libpq)
        holder.execute(statement)
        return holder

    def drop(self, url: str) -> None:
        name = sa.engine.make_url(url).database
        with self.engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        with self.engine.connect() as conn:
            for name in [*self.created, self.template]:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.engine.dispose()


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[PostgresDatabases]:
    probe = _admin()
    try:
        with probe.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        message = f"PostgreSQL is not reachable at {ADMIN_URL}: {exc.orig}"
        if REQUIRE_POSTGRES:
            pytest.fail(message + " (RUNLEDGER_REQUIRE_POSTGRES=1: these tests must run)")
        else:
            pytest.skip(message)
    finally:
        probe.dispose()
    databases = PostgresDatabases()
    yield databases
    databases.close()


def _sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'ledger.db'}"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger migrated once per session (closed, so the file holds all of it)."""
    directory = tmp_path_factory.mktemp("sqlite-template")
    ledger = Ledger.connect(_sqlite_url(directory))
    ledger.migrate()
    ledger.close()
    return directory / "ledger.db"


def _migrated_sqlite(template: Path, directory: Path) -> str:
    """A URL of a copy of the migrated template in ``directory``, as PostgreSQL's are cloned."""
    shutil.copyfile(template, directory / "ledger.db")
    return _sqlite_url(directory)


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty, migrated ledger database: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        yield _migrated_sqlite(request.getfixturevalue("sqlite_template"), tmp_path)
        return
    databases: PostgresDatabases = request.getfixturevalue("postgres_databases")
    url = databases.create()
    yield url
    databases.drop(url)


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    """A migrated Ledger on each dialect."""
    opened = Ledger.connect(db_url)
    yield opened
    opened.close()


@pytest.fixture
def fresh_db_url(db_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A factory of further fresh migrated databases of the same dialect as ``db_url``."""
    made: list[str] = []

    def make() -> str:
        if db_url.startswith("sqlite"):
            directory = tmp_path / f"db{len(made)}"
            directory.mkdir()
            url = _migrated_sqlite(request.getfixturevalue("sqlite_template"), directory)
        else:
            url = request.getfixturevalue("postgres_databases").create()
        made.append(url)
        return url

    yield make
    if not db_url.startswith("sqlite"):
        for url in made:
            request.getfixturevalue("postgres_databases").drop(url)


@pytest.fixture(params=DIALECTS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a database without the ledger schema (to test migrating), on each dialect."""
    if request.param == "sqlite":
        yield _sqlite_url(tmp_path)
        return
    databases: PostgresDatabases = request.getfixturevalue("postgres_databases")
    url = databases.create(migrated=False)
    yield url
    databases.drop(url)


@pytest.fixture(scope="session")
def prefect_api(postgres_databases: PostgresDatabases,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prefect server for the session (each xdist worker's own, so that tests on two workers
    never see each other's runs, blocks or artifacts), on PostgreSQL, its events in memory; its
    API URL, which flows and clients in this process use."""
    # Imported here, not above: Prefect reads PREFECT_HOME, set above, when first imported.
    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.support.prefect_server import drain_prefect_workers, prefect_server

    home = tmp_path_factory.mktemp("prefect-server")
    with prefect_server(postgres_databases, home, redis=False) as server, \
            temporary_settings(updates={PREFECT_API_URL: server.api}), \
            _temporary_global_settings_context(get_settings_context()):
        try:
            yield server.api
        finally:
            drain_prefect_workers()
