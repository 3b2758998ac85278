"""Command lines of the stack's processes, all run by the interpreter running this code, so
every process uses the same installed packages."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from deployments.project import PREFECT_FILE


def prefect_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def runledger_argv(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("runledger")
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "from flows.cli import main; main()", *args]


def server_argv(host: str, port: int, ui: bool) -> list[str]:
    return prefect_argv("server", "start", "--host", host, "--port", str(port),
                        "--ui" if ui else "--no-ui", "--analytics-off")


def worker_argv(pool: str, name: str, queues: Sequence[str] = ()) -> list[str]:
    """`prefect worker start` for a process worker polling ``queues`` (all queues when empty)."""
    argv = prefect_argv("worker", "start", "--pool", pool, "--type", "process", "--name", name,
                        "--install-policy", "never")
    for queue in queues:
        argv += ["--work-queue", queue]
    return argv


def deploy_argv(pool: str | None = None) -> list[str]:
    """`prefect deploy` of every deployment in deployments/prefect.yaml. Run it from the
    project root: the working directory recorded for workers is the one it runs in."""
    argv = prefect_argv("--no-prompt", "deploy", "--all", "--prefect-file", str(PREFECT_FILE))
    if pool:
        argv += ["--pool", pool]
    return argv


def sink_argv(host: str, port: int, maildir: Path) -> list[str]:
    return runledger_argv("sink", "--host", host, "--port", str(port), "--maildir", str(maildir))


def serve_argv() -> list[str]:
    return runledger_argv("serve")
