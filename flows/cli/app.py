"""The `runledger` Typer application; each command group lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="runledger",
    help="Idempotent scheduled AI jobs on Prefect, with a durable outbox.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
db_app = typer.Typer(help="Ledger database schema.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect logical runs, their attempts and outbox rows.", no_args_is_help=True)
outbox_app = typer.Typer(help="Inspect and operate the outbox.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(outbox_app, name="outbox")
