"""Ledger commands: `db upgrade`, `runs list|show|requeue`, `outbox list`."""

from __future__ import annotations

import json
from datetime import UTC
from functools import cache
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from flows.cli.app import db_app, outbox_app, runs_app
from flows.cli.tables import EMAIL, FOLD, Col, print_table, short_id, utc
from store import MESSAGE_STATUSES, RUN_STATUSES, Ledger, Run, RunledgerError

if TYPE_CHECKING:
    from flows.jobs import Job

console = Console()

# Job and period are what a list of Runs is read for; attempts and version go first on a
# narrow console (`runs show` has them). A recipient is worth more than the run id it belongs
# to (`outbox list --run`, `runs show`).
RUN_COLUMNS = [Col("run id"), Col("job"), Col("subject", fold=FOLD), Col("period"),
               Col("version", drop=1), Col("status"), Col("attempts", drop=2)]
ATTEMPT_COLUMNS = [Col("fence"), Col("attempt id", drop=3), Col("owner", fold=FOLD),
                   Col("started (UTC)", drop=1), Col("finished (UTC)", drop=2), Col("outcome"),
                   Col("error", fold=FOLD, optional=True)]
RUN_OUTBOX_COLUMNS = [Col("message id"), Col("channel", drop=1), Col("recipient", fold=EMAIL),
                      Col("status"), Col("attempts", drop=2),
                      Col("last error", fold=FOLD, optional=True)]
OUTBOX_COLUMNS = [Col("message id"), Col("run id", drop=1), Col("recipient", fold=EMAIL),
                  Col("subject", fold=FOLD), Col("status"), Col("attempts", drop=2),
                  Col("next attempt (UTC)", drop=3), Col("last error", fold=FOLD, optional=True)]


def open_ledger() -> Ledger:
    """The ledger at $RUNLEDGER_DATABASE_URL (default ./runledger.db); close it (``with``)."""
    return Ledger.connect()


def fail(error: BaseException) -> typer.Exit:
    """Print a domain error in one clear line and exit 1 (no traceback for expected errors)."""
    Console(stderr=True).print(f"[bold red]error:[/] {error}")
    return typer.Exit(1)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


@cache
def _job(name: str) -> Job | None:
    from flows.jobs import get_job

    try:
        return get_job(name)
    except RunledgerError:
        return None


def period_label(run: Run) -> str:
    """The Run's period as its user names it, the label of its start in the job's timezone
    (``2026-12-01``, ``2026-12-01T09:00+01:00``); in UTC when the job is not registered here
    or its cadence no longer starts a period there."""
    job = _job(run.job)
    if job is not None:
        period = job.period_at(run.period_start)
        if period.start == run.period_start:
            return period.label
    return run.period_start.astimezone(UTC).isoformat(timespec="minutes")


def _run_json(run: Run, exclude: set[str] | None = None) -> dict[str, Any]:
    """A Run as JSON: its fields, times in UTC, plus its ``period`` label (see period_label)."""
    return {**run.model_dump(mode="json", exclude=exclude), "period": period_label(run)}


def _check_choice(value: str | None, allowed: tuple[str, ...], what: str) -> None:
    if value is not None and value not in allowed:
        raise typer.BadParameter(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Alembic revision to upgrade to.")) -> None:
    """Create or migrate the ledger schema (Alembic upgrade) and create the registered jobs'
    own business tables that are missing. Run it before the workers of a new version start."""
    from flows.jobs import upgrade_ledger

    ledger = open_ledger()
    try:
        with_tables = upgrade_ledger(ledger, revision)
    except RunledgerError as exc:
        raise fail(exc) from exc
    finally:
        ledger.close()
    tables = f"; tables of {', '.join(with_tables)}" if with_tables else ""
    console.print(f"ledger schema at {revision} ({ledger.dialect}){tables}")


@runs_app.command("list")
def runs_list(
    job: str | None = typer.Option(None, "--job", help="Only runs of this job."),
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(RUN_STATUSES)}."),
    limit: int = typer.Option(100, "--limit", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List logical runs, newest period first."""
    _check_choice(status, RUN_STATUSES, "--status")
    with open_ledger() as ledger:
        runs = ledger.runs(job=job, status=status, limit=limit)
    if as_json:
        print_json([_run_json(r, exclude={"raw_input", "output"}) for r in runs])
        return
    print_table(console, RUN_COLUMNS, [
        [short_id(r.run_id), r.job, r.subject, period_label(r), r.version, r.status,
         str(r.attempts)] for r in runs])


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(..., help="The Run id, or a unique prefix of it (4+ characters)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one Run with its attempts and outbox rows."""
    with open_ledger() as ledger:
        try:
            run = ledger.get(ledger.resolve_run_id(run_id))
        except RunledgerError as exc:
            raise fail(exc) from exc
        attempts = ledger.attempts(run.run_id)
        messages = ledger.messages(run_id=run.run_id, limit=10_000)
    if as_json:
        print_json({
            "run": _run_json(run),
            "attempts": [a.model_dump(mode="json") for a in attempts],
            "outbox": [m.model_dump(mode="json", exclude={"body"}) for m in messages],
        })
        return
    console.print(f"[bold]{run.job}[/] / {run.subject} / {period_label(run)} / {run.version}")
    console.print(f"run id {run.run_id}\nstatus [bold]{run.status}[/], fence {run.fence}, "
                  f"attempts {run.attempts}, owner {run.owner or '-'}, "
                  f"lease until {run.lease_expires_at or '-'}")
    if run.error:
        console.print(f"error: {run.error}")
    print_table(console, ATTEMPT_COLUMNS, [
        [str(a.fence), a.attempt_id, a.owner, utc(a.started_at), utc(a.finished_at),
         a.outcome or "(open)", a.error or ""] for a in attempts], title="attempts")
    print_table(console, RUN_OUTBOX_COLUMNS, [
        [short_id(m.message_id), m.channel, m.recipient, m.status, str(m.attempts),
         m.last_error or ""] for m in messages], title="outbox")


@runs_app.command("requeue")
def runs_requeue(run_id: str = typer.Argument(
        ..., help="A failed Run's id, or a unique prefix of it (4+ characters).")) -> None:
    """Put a failed Run back to pending so the next flow run retries it."""
    with open_ledger() as ledger:
        try:
            run = ledger.requeue_run(ledger.resolve_run_id(run_id))
        except RunledgerError as exc:
            raise fail(exc) from exc
    console.print(f"run {run.run_id} is {run.status}")


@outbox_app.command("list")
def outbox_list(
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(MESSAGE_STATUSES)}."),
    run_id: str | None = typer.Option(None, "--run",
                                      help="Only messages of this Run (its id or a unique prefix)."),
    limit: int = typer.Option(100, "--limit", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List outbox messages (oldest first)."""
    _check_choice(status, MESSAGE_STATUSES, "--status")
    with open_ledger() as ledger:
        try:
            run = None if run_id is None else ledger.resolve_run_id(run_id)
        except RunledgerError as exc:
            raise fail(exc) from exc
        messages = ledger.messages(status=status, run_id=run, limit=limit)
    if as_json:
        print_json([m.model_dump(mode="json", exclude={"body"}) for m in messages])
        return
    print_table(console, OUTBOX_COLUMNS, [
        [short_id(m.message_id), short_id(m.run_id), m.recipient, m.subject, m.status,
         str(m.attempts), utc(m.next_attempt_at), m.last_error or ""] for m in messages])
