"""`runledger` command line: importing the command modules registers their commands."""

from __future__ import annotations

from flows.cli import ledger_commands  # noqa: F401  (registers db, runs, outbox list)
from flows.cli.app import app


def main() -> None:
    app()
