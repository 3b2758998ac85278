"""`runledger` command line: importing the command modules registers their commands."""

from __future__ import annotations

import flows.cli.delivery_commands  # noqa: F401  (registers deliver, outbox requeue|show, sink)
from flows.cli import (
    approval_commands,  # noqa: F401  (registers outbox held|approve|reject)
    backfill_commands,  # noqa: F401  (registers backfill)
    check_commands,  # noqa: F401  (registers check)
    cost_commands,  # noqa: F401  (registers costs)
    demo,  # noqa: F401  (registers demo)
    init_commands,  # noqa: F401  (registers init)
    ledger_commands,  # noqa: F401  (registers db, runs, outbox list)
    overdue_commands,  # noqa: F401  (registers overdue)
    prune_commands,  # noqa: F401  (registers prune)
    reconcile_commands,  # noqa: F401  (registers reconcile)
    release_commands,  # noqa: F401  (registers runs release)
    revise_commands,  # noqa: F401  (registers runs revise)
    run_commands,  # noqa: F401  (registers run)
    stack_commands,  # noqa: F401  (registers serve, stack up|automations)
    stats_commands,  # noqa: F401  (registers stats)
    status_commands,  # noqa: F401  (registers status)
)
from flows.cli.app import app, help_as_paragraphs
from flows.cli.output import error
from store import RunledgerError

__all__ = ["app", "main"]

help_as_paragraphs(app)


def main() -> None:
    """The `runledger` command: a runledger error no command caught (a ledger without its
    schema, an unreachable database) is one line on stderr and exit status 1, not a traceback."""
    try:
        app()
    except RunledgerError as exc:
        error(exc)
        raise SystemExit(1) from None
