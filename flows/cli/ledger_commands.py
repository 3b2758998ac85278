"""Ledger commands: `db upgrade`, `runs list|show|requeue`, `outbox list`."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from flows.cli.app import db_app, outbox_app, runs_app
from store import Ledger, RunledgerError
from store.models import MESSAGE_STATUSES, RUN_STATUSES

console = Console()


def open_ledger() -> Ledger:
    """The ledger at $RUNLEDGER_DATABASE_URL (default ./runledger.db)."""
    return Ledger.connect()


def fail(error: BaseException) -> typer.Exit:
    """Print a domain error in one clear line and exit 1 (no traceback for expected errors)."""
    Console(stderr=True).print(f"[bold red]error:[/] {error}")
    return typer.Exit(1)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _check_choice(value: str | None, allowed: tuple[str, ...], what: str) -> None:
    if value is not None and value not in allowed:
        raise typer.BadParameter(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Alembic revision to upgrade to.")) -> None:
    """Create or migrate the ledger schema (Alembic upgrade)."""
    ledger = open_ledger()
    ledger.migrate(revision)
    console.print(f"ledger schema at {revision} ({ledger.dialect})")


@runs_app.command("list")
def runs_list(
    job: str | None = typer.Option(None, "--job", help="Only runs of this job."),
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(RUN_STATUSES)}."),
    limit: int = typer.Option(100, "--limit", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List logical runs, newest period first."""
    _check_choice(status, RUN_STATUSES, "--status")
    runs = open_ledger().runs(job=job, status=status, limit=limit)
    if as_json:
        print_json([r.model_dump(mode="json", exclude={"raw_input", "output"}) for r in runs])
        return
    table = Table("run id", "job", "subject", "period start (UTC)", "version", "status", "attempts")
    for r in runs:
        table.add_row(r.run_id[:12], r.job, r.subject, r.period_start.isoformat(), r.version,
                      r.status, str(r.attempts))
    console.print(table)


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(..., help="The Run id (sha256 hex)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one Run with its attempts and outbox rows."""
    ledger = open_ledger()
    try:
        run = ledger.require(run_id)
    except RunledgerError as exc:
        raise fail(exc) from exc
    attempts = ledger.attempts(run_id)
    messages = ledger.messages(run_id=run_id, limit=10_000)
    if as_json:
        print_json({
            "run": run.model_dump(mode="json"),
            "attempts": [a.model_dump(mode="json") for a in attempts],
            "outbox": [m.model_dump(mode="json", exclude={"body"}) for m in messages],
        })
        return
    console.print(f"[bold]{run.job}[/] / {run.subject} / {run.period_start.isoformat()} / {run.version}")
    console.print(f"run id {run.run_id}\nstatus [bold]{run.status}[/], fence {run.fence}, "
                  f"attempts {run.attempts}, owner {run.owner or '-'}, "
                  f"lease until {run.lease_expires_at or '-'}")
    if run.error:
        console.print(f"error: {run.error}")
    table = Table("fence", "attempt id", "owner", "started", "finished", "outcome", "error",
                  title="attempts")
    for a in attempts:
        table.add_row(str(a.fence), a.attempt_id, a.owner, str(a.started_at),
                      str(a.finished_at or "-"), a.outcome or "(open)", a.error or "")
    console.print(table)
    outbox = Table("message id", "channel", "recipient", "status", "attempts", "last error",
                   title="outbox")
    for m in messages:
        outbox.add_row(m.message_id[:12], m.channel, m.recipient, m.status, str(m.attempts),
                       m.last_error or "")
    console.print(outbox)


@runs_app.command("requeue")
def runs_requeue(run_id: str = typer.Argument(..., help="A failed Run's id.")) -> None:
    """Put a failed Run back to pending so the next flow run retries it."""
    try:
        run = open_ledger().requeue_run(run_id)
    except RunledgerError as exc:
        raise fail(exc) from exc
    console.print(f"run {run.run_id} is {run.status}")


@outbox_app.command("list")
def outbox_list(
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(MESSAGE_STATUSES)}."),
    run_id: str | None = typer.Option(None, "--run", help="Only messages of this Run."),
    limit: int = typer.Option(100, "--limit", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List outbox messages (oldest first)."""
    _check_choice(status, MESSAGE_STATUSES, "--status")
    messages = open_ledger().messages(status=status, run_id=run_id, limit=limit)
    if as_json:
        print_json([m.model_dump(mode="json", exclude={"body"}) for m in messages])
        return
    table = Table("message id", "run id", "recipient", "subject", "status", "attempts",
                  "next attempt", "last error")
    for m in messages:
        table.add_row(m.message_id[:12], m.run_id[:12], m.recipient, m.subject, m.status,
                      str(m.attempts), str(m.next_attempt_at or "-"), m.last_error or "")
    console.print(table)
