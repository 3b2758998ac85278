"""The local stack's configuration: which databases and environment each process gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.stack.config import (
    DEFAULT_SENDER,
    StackConfig,
    absolute_ledger_url,
    flow_env,
    prefect_database_for,
)
from flows.stack.prefect_server import PREFECT_DB_ENV, REDIS_URL_ENV, server_env
from flows.stack.processes import StackError


def test_a_relative_sqlite_ledger_becomes_absolute_so_every_process_opens_one_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sqlite:///./runledger.db` names the file in the directory `stack up` started in."""
    monkeypatch.chdir(tmp_path)
    assert absolute_ledger_url("sqlite:///./runledger.db") == f"sqlite:///{tmp_path}/runledger.db"
    pg = "postgresql+psycopg://u:secret@db:5432/ledger"
    assert absolute_ledger_url(pg) == pg


def test_prefect_gets_its_own_database_next_to_a_postgresql_ledger() -> None:
    """An explicit Prefect URL wins; a PostgreSQL ledger gets `<ledger>_prefect` on the same
    server (asyncpg); a SQLite ledger leaves Prefect on SQLite in its home."""
    ledger = "postgresql+psycopg://u:secret@db:5432/ledger"
    assert prefect_database_for(ledger, None) == "postgresql+asyncpg://u:secret@db:5432/ledger_prefect"
    assert prefect_database_for(ledger, "postgresql+asyncpg://x@y/z") == "postgresql+asyncpg://x@y/z"
    assert prefect_database_for("sqlite:////tmp/l.db", None) is None


def test_flow_processes_get_the_stack_api_ledger_and_loopback_sink(tmp_path: Path) -> None:
    """Serve and workers talk to the stack's server, the given ledger and the sink without
    TLS (loopback); a sender the user set is kept; Prefect's database URL is not passed on."""
    config = StackConfig(home=tmp_path, port=4321)
    base = {"RUNLEDGER_MAIL_FROM": "me@example.com", PREFECT_DB_ENV: "postgresql+asyncpg://x/y",
            "PATH": "/bin"}
    env = flow_env(base, config, "sqlite:////tmp/l.db", 2525)
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:4321/api"
    assert env["RUNLEDGER_DATABASE_URL"] == "sqlite:////tmp/l.db"
    assert (env["RUNLEDGER_SMTP_HOST"], env["RUNLEDGER_SMTP_PORT"], env["RUNLEDGER_SMTP_TLS"]) == (
        "127.0.0.1", "2525", "none")
    assert env["RUNLEDGER_MAIL_FROM"] == "me@example.com" and PREFECT_DB_ENV not in env
    assert flow_env({}, config, "sqlite:////tmp/l.db", 2525)["RUNLEDGER_MAIL_FROM"] == DEFAULT_SENDER


def test_the_server_refuses_a_database_url_prefect_cannot_use(tmp_path: Path) -> None:
    """A psycopg URL for Prefect's database is an error naming the drivers it needs."""
    with pytest.raises(StackError, match=r"postgresql\+asyncpg://"):
        server_env({}, tmp_path, "postgresql+psycopg://u@h/db")
    env = server_env({"PREFECT_API_URL": "http://elsewhere/api"}, tmp_path, None)
    assert "PREFECT_API_URL" not in env and PREFECT_DB_ENV not in env
    assert env["PREFECT_HOME"] == str(tmp_path)


def test_a_server_given_redis_sends_its_events_through_prefect_redis(tmp_path: Path) -> None:
    """With a Redis URL the server's broker and cache are prefect-redis's, on that URL (its db
    included); without one, Prefect's in-memory default is left alone."""
    env = server_env({}, tmp_path, None, "redis://127.0.0.1:6379/3")
    assert env["PREFECT_MESSAGING_BROKER"] == env["PREFECT_MESSAGING_CACHE"] == (
        "prefect_redis.messaging")
    assert env[REDIS_URL_ENV] == "redis://127.0.0.1:6379/3"
    assert "PREFECT_MESSAGING_BROKER" not in server_env({}, tmp_path, None)


def test_the_stack_refuses_a_redis_url_that_is_not_one_before_starting(tmp_path: Path) -> None:
    """`stack up --redis` with another scheme is an error naming the schemes, raised when the
    configuration is made (before any folder, process or port is touched)."""
    with pytest.raises(StackError, match=r"redis:// or rediss://"):
        StackConfig(home=tmp_path / "stack", redis_url="http://127.0.0.1:6379")
    assert not (tmp_path / "stack").exists()
