"""`runledger` command line: importing the command modules registers their commands."""

from __future__ import annotations

import flows.cli.delivery_commands  # noqa: F401  (registers deliver, outbox requeue|show, sink)
from flows.cli import (
    demo,  # noqa: F401  (registers demo)
    ledger_commands,  # noqa: F401  (registers db, runs, outbox list)
    run_commands,  # noqa: F401  (registers run)
    stack_commands,  # noqa: F401  (registers serve, stack up|automations)
)
from flows.cli.app import app


def main() -> None:
    app()
