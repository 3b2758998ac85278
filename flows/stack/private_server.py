"""A Prefect server of one CLI command's own (`runledger run`, `runledger backfill` without
PREFECT_API_URL), in a session of its own: a Ctrl-C to the terminal's process group reaches the
command, which stops its flow run in order, and not the server its flow run still reports to
(Prefect's own temporary server shares the group: it died first, and the flow run's events then
failed every few seconds for minutes)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flows.ports import free_port
from flows.stack import commands
from flows.stack.prefect_server import api_url, server_env, wait_until_healthy
from flows.stack.processes import Supervisor

# Quiet: what matters reaches the person through the flow run's state and the command's output;
# stopping the server at the end cancels its services mid-flush, which they log as tracebacks.
QUIET = {"PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL", "PREFECT_LOGGING_ROOT_LEVEL": "CRITICAL",
         "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


@dataclass(frozen=True)
class PrivateServer:
    """The running server: its API URL, and how to stop it now (before an immediate exit)."""

    url: str
    supervisor: Supervisor

    def stop(self) -> None:
        self.supervisor.stop()


@contextmanager
def private_server(home: Path, timeout: float = 120.0) -> Iterator[PrivateServer]:
    """`prefect server start` on a free loopback port, its database in ``home`` (as Prefect's
    temporary server keeps it), in a session of its own; running while inside, stopped on the
    way out whatever happened."""
    with tempfile.TemporaryDirectory(prefix="runledger-server-") as logs:
        supervisor = Supervisor(Path(logs), grace_seconds=10)
        try:
            port = free_port()
            url = api_url("127.0.0.1", port)
            server = supervisor.start(
                "prefect-server", commands.server_argv("127.0.0.1", port, ui=False),
                {**server_env(os.environ, home, None), **QUIET})
            wait_until_healthy(url, server, timeout)
            yield PrivateServer(url, supervisor)
        finally:
            supervisor.stop()
