"""The `runs` commands: look at logical runs (`runs list|show`) and act on one (`runs requeue`,
`runs release` of a dead worker's lease, `runs revise` for a new output through the revise
flow in this process)."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.markup import escape

from flows.cli.app import LOOK, OPERATE, check_choice, runs_app
from flows.cli.flow_runs import run_here
from flows.cli.logical_runs import attempt_fields, period_label, prefect_ui_url, run_fields
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.tables import EMAIL, FOLD, Col, decision_text, print_table, short_id, utc
from flows.jobs.schedule import NOT_DUE_FLAG
from flows.prices import format_money
from flows.run_job.outcomes import outcome_name
from flows.spend import Spend, cache_text, spend_of
from store import (
    RUN_STATUSES,
    WITHDRAWN,
    Attempt,
    InvalidInput,
    ModelCall,
    Run,
    RunledgerError,
    latest_completed,
)

if TYPE_CHECKING:
    from prefect import State

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
                Col("reused", drop=5), Col("batch", fold=FOLD, optional=True),
                Col("error", fold=FOLD, optional=True)]
RUN_OUTBOX_COLUMNS = [Col("message id"), Col("channel", drop=1), Col("recipient", fold=EMAIL),
                      Col("status"), Col("attempts", drop=2),
                      Col("last error", fold=FOLD, optional=True),
                      Col("decision", fold=FOLD, optional=True)]

REFUSED_EXIT = 2  # an unknown Run, a Run that holds no lease, an owner that holds none


@runs_app.command("list", rich_help_panel=LOOK)
def runs_list(
    job: str | None = typer.Option(None, "--job", help="Only runs of this job."),
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(RUN_STATUSES)}."),
    limit: int = typer.Option(100, "--limit", min=1,
                              help="Show the N Runs of the newest periods (default 100)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List logical runs, newest period first."""
    check_choice(status, RUN_STATUSES, "--status")
    with ledger_session() as ledger:
        runs = ledger.runs(job=job, status=status, limit=limit)
        attempts = ledger.attempts_of([r.run_id for r in runs]) if as_json else {}
    if as_json:
        ui_url = prefect_ui_url()
        print_json([run_fields(r, attempts[r.run_id], ui_url) for r in runs])
        return
    print_table(console(), RUN_COLUMNS, [
        [short_id(r.run_id), r.job, r.subject, period_label(r), r.version, str(r.revision),
         r.status, str(r.attempts)] for r in runs])


@runs_app.command("show", rich_help_panel=LOOK)
def runs_show(
    run_id: str = typer.Argument(..., help="The Run id, or a unique prefix of it (4+ characters)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one Run with its attempts, model calls, outbox rows and revisions.

    Its period in the job's timezone and in UTC, its input version, its duration and its output
    location, which links into the Prefect UI when PREFECT_UI_URL or PREFECT_API_URL is set;
    each model call of each attempt with its outcome, tokens, latency, cost and how often its
    answer was reused from the checkpoint."""
    with ledger_session() as ledger:
        run = ledger.get(ledger.resolve_run_id(run_id))
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
         _prompt_tokens(c), _count(c.completion_tokens),
         "-" if c.latency_ms is None else f"{c.latency_ms} ms",
         _call_cost(c),
         str(c.reuses), c.batch_key or "", c.error or ""] for c in calls],
        title=f"model calls: {spend.paid} paid, {spend.lost} lost, {spend.reused} reused, "
              f"{spend.tokens} tokens{_cache(spend)}, {spend.money()}")
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
    if call.outcome == "queued":
        return "queued for a batch"
    if call.outcome == WITHDRAWN:
        return "not billed (withdrawn from its batch)"
    if call.cost_nanos is None and call.prompt_tokens is None and call.completion_tokens is None:
        return "in flight" if call.outcome is None else "unknown"
    return format_money(call.cost_nanos, call.currency)


def _prompt_tokens(call: ModelCall) -> str:
    """A call's prompt tokens, with those read from the provider's cache and written to it."""
    cache = cache_text(call.cached_tokens, call.cache_write_tokens)
    return _count(call.prompt_tokens) + (f" ({cache})" if cache else "")


def _cache(spend: Spend) -> str:
    cache = cache_text(spend.cached_tokens, spend.cache_write_tokens)
    return f" ({cache})" if cache else ""


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


@runs_app.command("requeue", rich_help_panel=OPERATE)
def runs_requeue(run_id: str = typer.Argument(
        ..., help="A failed Run's id, or a unique prefix of it (4+ characters).")) -> None:
    """Put a failed Run back to pending so the next flow run retries it."""
    with ledger_session() as ledger:
        run = ledger.requeue_run(ledger.resolve_run_id(run_id))
    console().print(f"run {run.run_id} is {run.status}")


@runs_app.command("release", rich_help_panel=OPERATE)
def runs_release(
    run_id: Annotated[str | None, typer.Argument(
        help="A running Run's id, or a unique prefix of it (4+ characters).")] = None,
    owner: Annotated[str | None, typer.Option(
        "--owner", help="Release every Run this lease owner holds (as `runledger status` "
                        "shows it, e.g. host:pid), instead of one Run.")] = None,
) -> None:
    """Take over the lease of a Run whose worker is dead, or of every Run one owner holds.

    Each Run goes back to pending at once (the next tick or `runledger reconcile JOB` runs it)
    and its fence is raised by one: if the worker was not dead after all, its next write (a
    renewal, its raw input, its model call's answer, its output) is refused and it ends
    LeaseLost, so nothing is written twice. Its Attempt ends released, and the Run's error
    says whose lease was taken over.

    Exit status: 0 when released; 2, with one line saying why, for an unknown Run, a Run that
    holds no lease (pending, completed, failed) or an owner that holds none."""
    if (run_id is None) == (owner is None):
        raise fail("give the Run to release (RUN) or the lease owner whose Runs to release "
                   "(--owner OWNER), one of the two", REFUSED_EXIT)
    with ledger_session(REFUSED_EXIT) as ledger:
        taken = ledger.take_over(ledger.resolve_run_id(run_id) if run_id else None, owner=owner)
    out = console()
    for run in taken:
        out.print(f"released {short_id(run.run_id)} {run.job}/{run.subject}/{period_label(run)}:"
                  f" {run.error}; now pending at fence {run.fence}", markup=False,
                  highlight=False)


def parse_params(text: str | None) -> dict[str, Any] | None:
    """--params as a JSON object, or None when not given."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--params must be a JSON object such as "
                           f"'{{\"recipients\": [\"ana@example.com\"]}}': {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"--params must be a JSON object, got {type(value).__name__}")
    return value


@runs_app.command("revise", rich_help_panel=OPERATE)
def runs_revise(
    run_id: Annotated[str, typer.Argument(
        help="The completed Run to revise: any of its revisions' ids, or a unique prefix "
             "(4+ characters); an unfinished revision's id resumes it.")],
    reason: Annotated[str, typer.Option("--reason", help="Why the output must be redone.")],
    recollect: Annotated[bool, typer.Option(
        "--recollect", help="Collect the input again instead of reusing the stored one.")] = False,
    resend: Annotated[bool, typer.Option(
        "--resend/--no-resend",
        help="Queue the revision's messages (new keys, 'revised' in the subject).")] = True,
    params: Annotated[str | None, typer.Option(
        "--params", help="The revision's parameters as a JSON object (default: the latest "
                         "completed revision's); they must be what the job computes now.")] = None,
    allow_not_due: Annotated[bool, typer.Option(
        NOT_DUE_FLAG, help="Revise a Run of a period not due yet (refused otherwise).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Compute a new output for a completed Run as its next revision.

    The revision is a new Run row linked to the original, computed through the revise flow: the
    original Run and its deliveries stay as they are.

    Uses the Prefect server at PREFECT_API_URL, or a temporary local one. At most one revision
    of a Run is unfinished at a time."""
    from flows.jobs.schedule import require_due
    from flows.registry import get_job, upgrade_ledger

    try:
        if not reason.strip():
            raise InvalidInput("--reason must say why the output is redone, e.g. "
                               "--reason 'recipients changed'")
        new_params = parse_params(params)
        with ledger_session() as ledger:
            upgrade_ledger(ledger)
            full_id = ledger.resolve_run_id(run_id)
            target = ledger.get(full_id)
        job = get_job(target.job)
        require_due(job, job.period_at(target.period_start), datetime.now(UTC),
                    allow_not_due=allow_not_due)
    except RunledgerError as exc:
        raise fail(exc) from None
    from flows.run_job.revision import RevisionReport

    def call() -> Coroutine[Any, Any, State[Any]]:
        from flows.run_job.revision import revise

        return cast("Coroutine[Any, Any, State[Any]]", revise(
            run_id=full_id, reason=reason, recollect=recollect, resend=resend,
            params=new_params, allow_not_due=allow_not_due, return_state=True))

    value, state = run_here(call, RevisionReport, what=f"the revision of run {full_id[:12]}")
    if as_json:
        print_json({**value.as_dict(), "flow_run_id": str(state.state_details.flow_run_id)})
    else:
        console().print(f"{outcome_name(state)}: {value.message}", markup=False,
                        highlight=False)
    if value.outcome == "failed":
        raise typer.Exit(1)
