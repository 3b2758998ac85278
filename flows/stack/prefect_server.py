"""A Prefect server process for the local stack and the acceptance tests, and the API client
the stack uses to talk to it (always an explicit URL, never Prefect's ephemeral server)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import httpx
from prefect.client.orchestration import SyncPrefectClient

from flows.stack.processes import Child, StackError

PREFECT_DB_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
# prefect-redis's broker and cache: the server's events go through Redis streams instead of
# in-memory queues, which drop messages once 10,000 wait for a slow consumer.
REDIS_MESSAGING = "prefect_redis.messaging"
REDIS_URL_ENV = "PREFECT_REDIS_MESSAGING_URL"


def api_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/api"


def ui_url(host: str, port: int) -> str:
    return f"http://{host}:{port}"


def redis_messaging_env(url: str) -> dict[str, str]:
    """A server's settings for event messaging through Redis at ``url``
    (``redis://host:port/db``; a db of its own, as two servers on one db share streams)."""
    if not url.startswith(("redis://", "rediss://")):
        raise StackError(f"Redis messaging needs a redis:// or rediss:// URL, got "
                         f"{url.split('://')[0]}://...")
    return {"PREFECT_MESSAGING_BROKER": REDIS_MESSAGING,
            "PREFECT_MESSAGING_CACHE": REDIS_MESSAGING, REDIS_URL_ENV: url}


def server_env(base: Mapping[str, str], home: Path, database_url: str | None,
               redis_url: str | None = None) -> dict[str, str]:
    """The server's environment: its own PREFECT_HOME (SQLite database there unless
    ``database_url`` names a PostgreSQL one, as ``postgresql+asyncpg://...``), and its events
    through Redis when ``redis_url`` is given."""
    env = {key: value for key, value in base.items() if key != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(home)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env.pop(PREFECT_DB_ENV, None)
    if database_url:
        if not database_url.startswith(("postgresql+asyncpg://", "sqlite+aiosqlite://")):
            raise StackError(
                f"Prefect's database URL must start with postgresql+asyncpg:// or "
                f"sqlite+aiosqlite://, got {database_url.split('://')[0]}://..."
            )
        env[PREFECT_DB_ENV] = database_url
    if redis_url:
        env.update(redis_messaging_env(redis_url))
    return env


def wait_until_healthy(url: str, server: Child, timeout: float = 120.0) -> None:
    """Block until ``url``/health answers; fail with the server's log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.running():
            raise StackError(f"the Prefect server exited ({server.process.returncode}):\n"
                             f"{server.log_tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise StackError(f"the Prefect server at {url} was not healthy after {timeout:.0f} s:\n"
                     f"{server.log_tail()}")


def client(url: str, auth_string: str | None = None) -> SyncPrefectClient:
    """A synchronous Prefect client for the server at ``url`` (use it as a context manager),
    authenticated with ``auth_string`` or else PREFECT_API_AUTH_STRING, when either is set."""
    from prefect.settings import PREFECT_API_AUTH_STRING

    return SyncPrefectClient(api=url, auth_string=auth_string or PREFECT_API_AUTH_STRING.value())
