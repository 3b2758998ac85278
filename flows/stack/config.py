"""What a local stack starts and where (``StackConfig``), and the databases and environment its
processes get: the ledger URL every process opens, Prefect's own database, the flow runners'
environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from flows.stack.auth import NO_AUTH, StackAuth
from flows.stack.automations import HEARTBEAT_SECONDS
from flows.stack.prefect_server import PREFECT_DB_ENV, api_url, redis_messaging_env
from flows.stack.work_pool import DEFAULT_POOL

DEFAULT_SENDER = "runledger@example.org"


@dataclass(frozen=True)
class StackConfig:
    """What to start and where: ``home`` holds Prefect's files, the logs and the mail folder."""

    home: Path
    host: str = "127.0.0.1"
    port: int = 4200
    workers: int = 0
    pool: str = DEFAULT_POOL
    kickoff: bool = True
    crash_after_seconds: float = 3 * HEARTBEAT_SECONDS
    prefect_database_url: str | None = None
    redis_url: str | None = None
    auth: StackAuth = NO_AUTH

    def __post_init__(self) -> None:
        if self.redis_url:  # refused before anything starts
            redis_messaging_env(self.redis_url)

    @property
    def mail_dir(self) -> Path:
        return self.home / "mail"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    @property
    def record(self) -> Path:
        """Where a running stack says who it is: pid, UI, ledger."""
        return self.home / "stack.json"

    @property
    def api(self) -> str:
        return api_url(self.host, self.port)


def absolute_ledger_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute, so every process opens the same file."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and \
            parsed.database != ":memory:" and not Path(parsed.database).is_absolute():
        parsed = parsed.set(database=str(Path(parsed.database).resolve()))
    return parsed.render_as_string(hide_password=False)


def prefect_database_for(ledger_url: str, explicit: str | None) -> str | None:
    """Prefect's own database: ``explicit`` if given; on a PostgreSQL ledger, a database named
    after the ledger's with ``_prefect`` on the same server; else None (SQLite in PREFECT_HOME).
    Prefect needs its own database: its tables include an ``alembic_version`` like the ledger's."""
    if explicit:
        return explicit
    parsed = sa.engine.make_url(ledger_url)
    if parsed.get_backend_name() != "postgresql":
        return None
    return parsed.set(drivername="postgresql+asyncpg",
                      database=f"{parsed.database}_prefect").render_as_string(hide_password=False)


def flow_env(base: Mapping[str, str], config: StackConfig, ledger_url: str,
             smtp_port: int) -> dict[str, str]:
    """The environment of every process that runs flows (serve or workers), and of `prefect
    deploy`: clients of the stack's server, with its auth string if it has one."""
    env = config.auth.client_env(base)
    env.update({
        "PREFECT_API_URL": config.api,
        "PREFECT_HOME": str(config.prefect_home),
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS),
        "PREFECT_RUNNER_POLL_FREQUENCY": "5",
        "PREFECT_WORKER_QUERY_SECONDS": "5",
        "RUNLEDGER_DATABASE_URL": ledger_url,
        "RUNLEDGER_SMTP_HOST": "127.0.0.1",
        "RUNLEDGER_SMTP_PORT": str(smtp_port),
        "RUNLEDGER_SMTP_TLS": "none",
    })
    env.setdefault("RUNLEDGER_MAIL_FROM", DEFAULT_SENDER)
    env.pop(PREFECT_DB_ENV, None)
    return env


def shown_url(url: str) -> str:
    """``url`` without its password."""
    return sa.engine.make_url(url).render_as_string(hide_password=True)
