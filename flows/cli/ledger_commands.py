"""Ledger commands: `db upgrade`, `runs list|show|requeue`, `outbox list`."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from flows.cli.app import db_app, outbox_app, runs_app
from flows.cli.logical_runs import attempt_fields, period_label, prefect_ui_url, run_fields
from flows.cli.output import console, fail, open_ledger, print_json
from flows.cli.tables import EMAIL, FOLD, Col, decision_text, print_table, short_id, utc
from flows.prices import format_money
from flows.spend import spend_of
from store import (
    CHANNELS,
    MESSAGE_STATUSES,
    RUN_STATUSES,
    Attempt,
    ModelCall,
    Run,
    RunledgerError,
    latest_completed,
)

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
CALL_COLUMNS = [Col("fence"), Col("pos"), Col("model", fold=FOLD, drop=3),
                Col("started (UTC)", drop=2), Col("outcome"), Col("tokens in", drop=4),
                Col("tokens out", drop=4), Col("latency", drop=1), Col("cost", fold=FOLD),
                Col("reused", drop=5), Col("error", fold=FOLD, optional=True)]
RUN_OUTBOX_COLUMNS = [Col("message id"), Col("channel", drop=1), Col("recipient", fold=EMAIL),
                      Col("status"), Col("attempts", drop=2),
                      Col("last error", fold=FOLD, optional=True),
                      Col("decision", fold=FOLD, optional=True)]
# An address is what the list is read for and a folded one is misread: it never folds; the
# run id, the channel and the subject are left out first at 80 columns. "for" is the Run a
# message belongs to (job, subject, period): a webhook's or object's target and subject are
# the same on every row of a job.
OUTBOX_COLUMNS = [Col("message id"), Col("run id", drop=6), Col("channel", drop=5),
                  Col("target"), Col("for", fold=FOLD, drop=3),
                  Col("subject", fold=FOLD, drop=4), Col("status"),
                  Col("attempts", drop=1), Col("next attempt (UTC)", drop=2),
                  Col("last error", fold=FOLD, optional=True)]


def run_for(run: Run | None) -> str:
    """The Run a message belongs to, as its job, subject and period (``-`` if pruned)."""
    return "-" if run is None else f"{run.job} {run.subject} {period_label(run)}"


def _check_choice(value: str | None, allowed: tuple[str, ...], what: str) -> None:
    if value is not None and value not in allowed:
        raise typer.BadParameter(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Alembic revision to upgrade to.")) -> None:
    """Create or migrate the ledger schema and the registered jobs' tables.

    Runs Alembic's upgrade to REVISION, then creates the registered jobs' own business tables
    that are missing. Run it before the workers of a new version start."""
    from flows.registry import upgrade_ledger

    ledger = open_ledger()
    try:
        with_tables = upgrade_ledger(ledger, revision)
    except RunledgerError as exc:
        raise fail(exc) from exc
    finally:
        ledger.close()
    tables = f"; tables of {', '.join(with_tables)}" if with_tables else ""
    console().print(f"ledger schema at {revision} ({ledger.dialect}){tables}")


@runs_app.command("list")
def runs_list(
    job: str | None = typer.Option(None, "--job", help="Only runs of this job."),
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(RUN_STATUSES)}."),
    limit: int = typer.Option(100, "--limit", min=1,
                              help="Show the N Runs of the newest periods (default 100)."),
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
    print_table(console(), RUN_COLUMNS, [
        [short_id(r.run_id), r.job, r.subject, period_label(r), r.version, str(r.revision),
         r.status, str(r.attempts)] for r in runs])


@runs_app.command("show")
def runs_show(
    run_id: str = typer.Argument(..., help="The Run id, or a unique prefix of it (4+ characters)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one Run with its attempts, model calls, outbox rows and revisions.

    Its period in the job's timezone and in UTC, its input version, its duration and its output
    location, which links into the Prefect UI when PREFECT_UI_URL or PREFECT_API_URL is set;
    each model call of each attempt with its outcome, tokens, latency, cost and how often its
    answer was reused from the checkpoint."""
    with open_ledger() as ledger:
        try:
            run = ledger.get(ledger.resolve_run_id(run_id))
        except RunledgerError as exc:
            raise fail(exc) from exc
        attempts = ledger.attempts(run.run_id)
        calls = ledger.calls.of_run(run.run_id)
        messages = ledger.outbox.messages(run_id=run.run_id, limit=10_000)
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
            "model_calls": [c.model_dump(mode="json") for c in calls],
            "spend": spend_of([c.model_dump() for c in calls]).as_dict(),
            "outbox": [m.model_dump(mode="json", exclude={"body"}) for m in messages],
            "lineage": lineage,
        })
        return
    out = console()
    _print_run(out, run, record)
    if len(revisions) > 1:
        print_table(out, LINEAGE_COLUMNS, [
            [f"{r.revision}{' (current result)' if r is current else ''}", short_id(r.run_id),
             r.status, utc(r.created_at), r.revision_reason or ""] for r in revisions],
            title="revisions (the result is the latest completed)")
    print_table(out, ATTEMPT_COLUMNS, [
        [str(a.fence), a.attempt_id, a.owner, utc(a.started_at), utc(a.finished_at),
         _duration(attempt_fields(a)["duration_seconds"]), a.outcome or "(open)",
         _attempt_calls(a, calls), a.error or ""]
        for a in attempts], title="attempts")
    spend = spend_of([c.model_dump() for c in calls])
    print_table(out, CALL_COLUMNS, [
        [str(c.fence), str(c.position), c.model, utc(c.started_at), c.outcome or "(in flight)",
         _count(c.prompt_tokens), _count(c.completion_tokens),
         "-" if c.latency_ms is None else f"{c.latency_ms} ms",
         _call_cost(c),
         str(c.reuses), c.error or ""] for c in calls],
        title=f"model calls: {spend.paid} paid, {spend.lost} lost, {spend.reused} reused, "
              f"{spend.tokens} tokens, {spend.money()}")
    print_table(out, RUN_OUTBOX_COLUMNS, [
        [short_id(m.message_id), m.channel, m.recipient, m.status, str(m.attempts),
         m.last_error or "", decision_text(m.decision, m.decided_by, m.decided_at,
                                           m.decision_reason)]
        for m in messages], title="outbox")


def _attempt_calls(attempt: Attempt, calls: list[ModelCall]) -> str:
    """The calls that left during an Attempt, from the ledger's call records (a killed
    Attempt's too); an Attempt of a Run recorded before calls were (no records) shows the
    count it kept when it ended."""
    if calls:
        return str(sum(1 for c in calls if c.fence == attempt.fence))
    return "-" if attempt.model_calls is None else str(attempt.model_calls)


def _call_cost(call: ModelCall) -> str:
    """A call's cost for people: not billed (refused), unknown (no usage reached the ledger),
    no price, or the amount."""
    if call.outcome == "refused":
        return "not billed"
    if call.cost_nanos is None and call.prompt_tokens is None and call.completion_tokens is None:
        return "in flight" if call.outcome is None else "unknown"
    return format_money(call.cost_nanos, call.currency)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def _print_run(out: Console, run: Run, record: dict[str, Any]) -> None:
    """The Run's identity, period, state, evidence and output location, as lines of text."""
    window = record["period_window"]
    out.print(f"[bold]{escape(run.job)}[/] / {escape(run.subject)} / {record['period']} / "
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
                 f"owner {run.owner or '-'}, "
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
        out.print(line, markup=False, highlight=False)


@runs_app.command("requeue")
def runs_requeue(run_id: str = typer.Argument(
        ..., help="A failed Run's id, or a unique prefix of it (4+ characters).")) -> None:
    """Put a failed Run back to pending so the next flow run retries it."""
    with open_ledger() as ledger:
        try:
            run = ledger.requeue_run(ledger.resolve_run_id(run_id))
        except RunledgerError as exc:
            raise fail(exc) from exc
    console().print(f"run {run.run_id} is {run.status}")


@outbox_app.command("list")
def outbox_list(
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(MESSAGE_STATUSES)}."),
    run_id: str | None = typer.Option(None, "--run",
                                      help="Only messages of this Run (its id or a unique prefix)."),
    channel: str | None = typer.Option(None, "--channel", help=f"One of {', '.join(CHANNELS)}."),
    limit: int = typer.Option(100, "--limit", min=1,
                              help="Show the newest N messages (default 100)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List outbox messages, newest first; the target is the address, the webhook endpoint,
    or the bucket block and object key."""
    _check_choice(status, MESSAGE_STATUSES, "--status")
    _check_choice(channel, CHANNELS, "--channel")
    with open_ledger() as ledger:
        try:
            run = None if run_id is None else ledger.resolve_run_id(run_id)
        except RunledgerError as exc:
            raise fail(exc) from exc
        messages = ledger.outbox.recent_messages(status=status, run_id=run, channel=channel,
                                                 limit=limit)
        runs = ledger.get_many(list(dict.fromkeys(m.run_id for m in messages)))
    if as_json:
        print_json([m.model_dump(mode="json", exclude={"body", "payload"}) for m in messages])
        return
    out = console()
    print_table(out, OUTBOX_COLUMNS, [
        [short_id(m.message_id), short_id(m.run_id), m.channel, m.recipient,
         run_for(runs.get(m.run_id)), m.subject, m.status, str(m.attempts),
         utc(m.next_attempt_at), m.last_error or ""] for m in messages])
    if len(messages) == limit:
        out.print(f"the newest {limit}; older ones with a larger --limit", highlight=False)
