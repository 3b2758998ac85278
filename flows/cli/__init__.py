"""`runledger` command line: importing the command modules registers their commands, each in
the help panel of what a person does with it (app.py: run work, look, operate, set up)."""

from __future__ import annotations

from flows.cli import (
    backfill_commands,  # noqa: F401  (registers backfill)
    batch_commands,  # noqa: F401  (registers batches poll|list|show)
    check_commands,  # noqa: F401  (registers check)
    cost_commands,  # noqa: F401  (registers costs)
    db_commands,  # noqa: F401  (registers db upgrade)
    delivery_commands,  # noqa: F401  (registers deliver, sink)
    demo,  # noqa: F401  (registers demo)
    init_commands,  # noqa: F401  (registers init)
    outbox_commands,  # noqa: F401  (registers outbox list|show|held|approve|reject|requeue)
    overdue_commands,  # noqa: F401  (registers overdue)
    prune_commands,  # noqa: F401  (registers prune)
    reconcile_commands,  # noqa: F401  (registers reconcile)
    run_commands,  # noqa: F401  (registers run)
    runs_commands,  # noqa: F401  (registers runs list|show|requeue|release|revise)
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
