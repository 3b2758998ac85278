"""A `prefect server start` on a new PostgreSQL database: the session's (each xdist worker's)
and the drills' own, whose events go through a Redis db of their own (or Prefect's in-memory
queues). Not Prefect's SQLite-backed test harness: on a loaded machine its locked database
answered flow-run creations and block saves with HTTP 503 past every client retry."""


from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.utilities.asyncutils import run_coro_as_sync

from flows.ports import free_port
from flows.stack import commands
from flows.stack.prefect_server import api_url, server_env, wait_until_healthy
from flows.stack.processes import Supervisor

# "redis": the server's events through Redis streams (prefect-redis); "memory": Prefect's
# default in-memory queues, which drop events past 10,000 waiting.
MESSAGING = os.environ.get("RUNLEDGER_DRILL_MESSAGING", "redis")
REDIS = os.environ.get("RUNLEDGER_DRILL_REDIS", "redis://127.0.0.1:6379")
REDIS_DBS = range(8, 16)  # the drills': the first empty one a session can claim
CLAIM_KEY = "runledger-drill-claim"
# Only until the server writes its first stream (then the db is not empty): longer than any
# server takes to start.
CLAIM_SECONDS = 3600


@dataclass(frozen=True)
class Server:
    api: str
    log: Path
    messaging: str


@contextmanager
def redis_db() -> Iterator[str | None]:
    """The URL of a Redis db of the drill's own (an empty one of REDIS_DBS, claimed with a key
    that expires), flushed at the end; None with memory messaging."""
    if MESSAGING == "memory":
        yield None
        return
    import redis

    for db in REDIS_DBS:
        url = f"{REDIS}/{db}"
        client = redis.Redis.from_url(url)
        try:
            claimed = client.dbsize() == 0 and client.set(
                CLAIM_KEY, os.getpid(), nx=True, ex=CLAIM_SECONDS)
        except redis.ConnectionError as exc:
            client.close()
            message = f"Redis is not reachable at {REDIS}: {exc}"
            if os.environ.get("RUNLEDGER_REQUIRE_POSTGRES") == "1":
                pytest.fail(message + " (RUNLEDGER_REQUIRE_POSTGRES=1: this drill must run)")
            else:
                pytest.skip(message)
        if claimed:
            try:
                yield url
            finally:
                client.flushdb()
                client.close()
            return
        client.close()
    pytest.fail(f"no empty Redis db among {REDIS_DBS.start}-{REDIS_DBS.stop - 1} at {REDIS}")


@contextmanager
def prefect_server(postgres_databases: Any, home: Path, *,
                   redis: bool = MESSAGING == "redis") -> Iterator[Server]:
    """A `prefect server start` on a new PostgreSQL database, its events through a Redis db of
    its own when ``redis`` (else in memory), its files under ``home``; stopped, the database
    dropped and the Redis db flushed at the end."""
    with redis_db() if redis else nullcontext() as redis_url:
        name = postgres_databases.create(migrated=False)
        database = sa.engine.make_url(name).set(
            drivername="postgresql+asyncpg").render_as_string(hide_password=False)
        supervisor = Supervisor(home / "logs", grace_seconds=10)
        port = free_port()
        api = api_url("127.0.0.1", port)
        # Its log names the cause of any 503 it answers (a retryable database error).
        env = {**server_env(os.environ, home / "prefect", database, redis_url),
               "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"}
        try:
            child = supervisor.start("prefect-server",
                                     commands.server_argv("127.0.0.1", port, ui=False), env)
            wait_until_healthy(api, child, timeout=180)
            yield Server(api, child.log, "Redis" if redis_url else "in memory")
        finally:
            supervisor.stop()
            postgres_databases.drop(name)


def drain_prefect_workers() -> None:
    """Send the logs and events this process still holds before its server stops (else their
    workers fail to connect as the session ends)."""
    async def drain() -> None:
        try:
            result: Any = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        except RuntimeError:
            pass  # never started
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())
