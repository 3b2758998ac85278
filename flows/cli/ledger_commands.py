"""Ledger commands: `db upgrade`, `runs list|show|requeue`, `outbox list`."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from flows.cli.app import db_app, outbox_app, runs_app
from flows.cli.logical_runs import attempt_fields, period_label, prefect_ui_url, run_fields
from flows.cli.tables import EMAIL, FOLD, Col, print_table, short_id, utc
from store import MESSAGE_STATUSES, RUN_STATUSES, Ledger, Run, RunledgerError, latest_completed

console = Console()

# Job and period are what a list of Runs is read for; attempts and version go first on a
# narrow console (`runs show` has them). A recipient is worth more than the run id it belongs
# to (`outbox list --run`, `runs show`).
RUN_COLUMNS = [Col("run id"), Col("job"), Col("subject", fold=FOLD), Col("period"),
               Col("version", drop=1), Col("rev", drop=3), Col("status"),
               Col("attempts", drop=2)]
LINEAGE_COLUMNS = [Col("revision"), Col("run id"), Col("status"), Col("created (UTC)", drop=1),
                   Col("reason", fold=FOLD, optional=True)]
ATTEMPT_COLUMNS = [Col("fence"), Col("attempt id", drop=5), Col("owner", fold=FOLD),
                   Col("started (UTC)", drop=2), Col("finished (UTC)", drop=3),
                   Col("duration", drop=1), Col("outcome"), Col("model calls", drop=4),
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
        attempts = ledger.attempts_of([r.run_id for r in runs]) if as_json else {}
    if as_json:
        ui_url = prefect_ui_url()
        print_json([run_fields(r, attempts[r.run_id], ui_url) for r in runs])
        return
    print_table(console, RUN_COLUMNS, [
        [short_id(r.run_id), r.job, r.subject, period_label(r), r.version, str(r.revision),
         r.status, str(r.attempts)] for r in runs])


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(..., help="The Run id, or a unique prefix of it (4+ characters)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one Run with its period (in the job's timezone and UTC), input version, duration,
    output location (links into the Prefect UI when PREFECT_UI_URL or PREFECT_API_URL is set),
    attempts and outbox rows."""
    with open_ledger() as ledger:
        try:
            run = ledger.get(ledger.resolve_run_id(run_id))
        except RunledgerError as exc:
            raise fail(exc) from exc
        attempts = ledger.attempts(run.run_id)
        messages = ledger.messages(run_id=run.run_id, limit=10_000)
        revisions = ledger.revisions(run.run_id)
    record = run_fields(run, attempts, prefect_ui_url())
    current = latest_completed(revisions)
    lineage = [{"revision": r.revision, "run_id": r.run_id, "status": r.status,
                "reason": r.revision_reason, "revises_run_id": r.revises_run_id,
                "created_at": utc(r.created_at), "completed_at": utc(r.completed_at),
                "current": current is not None and r.run_id == current.run_id}
               for r in revisions]
    if as_json:
        print_json({
            "run": {**record, "raw_input": run.raw_input, "output": run.output},
            "attempts": [attempt_fields(a) for a in attempts],
            "outbox": [m.model_dump(mode="json", exclude={"body"}) for m in messages],
            "lineage": lineage,
        })
        return
    _print_run(run, record)
    if len(revisions) > 1:
        print_table(console, LINEAGE_COLUMNS, [
            [f"{r.revision}{' (current result)' if r is current else ''}", short_id(r.run_id),
             r.status, utc(r.created_at), r.revision_reason or ""] for r in revisions],
            title="revisions (the result is the latest completed)")
    print_table(console, ATTEMPT_COLUMNS, [
        [str(a.fence), a.attempt_id, a.owner, utc(a.started_at), utc(a.finished_at),
         _duration(attempt_fields(a)["duration_seconds"]), a.outcome or "(open)",
         "-" if a.model_calls is None else str(a.model_calls), a.error or ""]
        for a in attempts], title="attempts")
    print_table(console, RUN_OUTBOX_COLUMNS, [
        [short_id(m.message_id), m.channel, m.recipient, m.status, str(m.attempts),
         m.last_error or ""] for m in messages], title="outbox")


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def _print_run(run: Run, record: dict[str, Any]) -> None:
    """The Run's identity, period, state, evidence and output location, as lines of text."""
    window = record["period_window"]
    console.print(f"[bold]{escape(run.job)}[/] / {escape(run.subject)} / {record['period']} / "
                  f"{escape(run.version)}", highlight=False)
    lines = [f"run id {run.run_id} (its run key)"]
    if run.revision:
        lines.append(f"revision {run.revision} of run {run.revises_run_id} "
                     f"(reason: {run.revision_reason})")
    if window["timezone"] is not None:
        lines.append(f"period {window['start']} to {window['end']} ({window['timezone']}); "
                     f"UTC {window['start_utc']} to {window['end_utc']}")
    else:
        lines.append(f"period starting {window['start_utc']} (UTC; job {run.job} is not "
                     "registered here)")
    lines.append(f"status {run.status}, fence {run.fence}, attempts {run.attempts} "
                 f"(numbers {', '.join(map(str, record['attempt_numbers'])) or '-'}), "
                 f"model calls {run.model_calls}, owner {run.owner or '-'}, "
                 f"lease until {run.lease_expires_at or '-'}")
    if run.pruned_at is not None:
        lines.append(f"tombstone: output pruned on {utc(run.pruned_at)} UTC (sha256 "
                     f"{run.output_digest}); its raw input, output, params, attempts, sent and "
                     "dead outbox rows were deleted by `runledger prune`; a rerun of its period "
                     "is still a duplicate")
    gone = "- (pruned)" if run.pruned_at is not None else "- (no raw input stored)"
    lines.append(f"input version {record['input_version'] or gone}")
    lines.append(f"duration {_duration(record['duration_seconds'])} (first claim to "
                 f"completion, {utc(run.completed_at)} UTC)")
    where = record["output_location"]
    if where["flow_run_id"] is not None:
        lines.append(f"completed by flow run {where['flow_run_url'] or where['flow_run_id']}")
        lines.append(f"  in task run {where['task_run_url'] or where['task_run_id']}")
    elif run.status == "completed":
        lines.append("completed outside a Prefect flow run (no output location recorded)")
    if run.error:
        lines.append(f"error: {run.error}")
    for line in lines:
        console.print(line, markup=False, highlight=False)


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
