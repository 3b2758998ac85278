"""`runledger run JOB`: one tick of a job, in this process, printed subject by subject."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.text import Text

from flows.cli.app import RUN_WORK, app
from flows.cli.flow_runs import run_here
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.tables import FOLD, Col, print_table, short_id
from flows.errors import NotReady
from flows.jobs.schedule import NOT_DUE_FLAG
from store import Period, RunledgerError

if TYPE_CHECKING:
    from prefect import State

    from flows.run_job.outcomes import Outcome, TickReport

HELD_ELSEWHERE_EXIT = 3  # nothing failed, but another worker holds a Run of the tick

# One style per Outcome (flows/run_job/outcomes.py); tests/unit/test_outcome_renderers.py walks
# every outcome through every table, so a new one cannot crash a command after its tick ran.
STYLES: dict[Outcome, str] = {
    "new": "green", "duplicate": "cyan", "in-progress-elsewhere": "yellow",
    "lease-lost": "yellow", "stopped": "yellow", "skipped": "dim", "over-budget": "magenta",
    "waiting": "blue", "failed": "bold red"}


@app.command("run", rich_help_panel=RUN_WORK)
def run(
    job: Annotated[str, typer.Argument(help="A registered job, e.g. competitor-summary.")],
    subject: Annotated[list[str] | None, typer.Option(
        "--subject", "-s", help="A subject to run (repeatable); default: all of the job's.")] = None,
    period: Annotated[str | None, typer.Option(
        "--period",
        help="A date YYYY-MM-DD in the job's timezone, or an ISO datetime with an offset; "
             "default: the latest period that is due.")] = None,
    allow_not_due: Annotated[bool, typer.Option(
        NOT_DUE_FLAG, help="Run a period that is not due yet (refused otherwise: a completed "
                           "Run never changes).")] = False,
    batch: Annotated[bool | None, typer.Option(
        "--batch/--no-batch",
        help="Send the model calls through the provider's Batch API at its batch price, and "
             "return once the batch is created (`runledger batches poll` finishes the Runs); "
             "default: the job's own choice.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Run one tick of JOB now through the run-job flow and print each subject's outcome.

    Uses the Prefect server at PREFECT_API_URL, or a temporary local one. The ledger schema
    and the jobs' own tables are created or migrated first (RUNLEDGER_DATABASE_URL), as by
    `runledger db upgrade`. A job whose model endpoint is unknown, or whose targets name a
    missing or invalid block, is refused before that and before any flow run.

    With --batch, each model call is queued for the provider's Batch API (half the price):
    the command returns once the batch is created, naming it, with the Runs waiting;
    `runledger batches poll` (the settle-batches deployment's schedule) settles the batch once
    it ended and finishes them.

    Exit status: 0 when the tick ran (or its batch was created); 1 when a subject failed; 2 for a bad job, subject or
    period, an unknown model endpoint or a missing or invalid block (nothing run; one line,
    docs/how-to/outbox.md); 3 when nothing failed but a Run is held elsewhere (another worker
    holds its lease): a line names who holds it and until when; wait for it, or run
    `runledger runs release RUN` if that worker is dead."""
    from flows.jobs.schedule import require_due
    from flows.registry import get_job, upgrade_ledger

    # Job, subjects and period are checked before any ledger or server is touched.
    now = datetime.now(UTC)
    try:
        definition = get_job(job)
        the_period = definition.parse_period(period) if period else \
            definition.latest_due_period(now)
        definition.resolve_subjects(subject or None)
        require_due(definition, the_period, now, allow_not_due=allow_not_due)
    except RunledgerError as exc:
        raise fail(exc, code=2) from None
    from flows.run_job.outcomes import TickReport

    def ready() -> None:
        """The tick's endpoint and targets' blocks checked (on the Prefect server the flow run
        uses), then the ledger upgraded: a job that is not ready writes nothing."""
        from flows.run_job.preflight import preflight
        from flows.settings import RunledgerSettings

        preflight(definition, RunledgerSettings(),
                  batch=definition.batch if batch is None else batch)
        with ledger_session() as ledger:
            upgrade_ledger(ledger)

    async def call() -> State[Any]:
        from flows.run_job.flow import run_job

        await asyncio.to_thread(ready)
        return await cast("Coroutine[Any, Any, State[Any]]", run_job(
            job=job, subjects=subject or None, period=period or the_period.start.isoformat(),
            allow_not_due=allow_not_due, batch=batch, return_state=True))

    def stopped() -> None:
        _print_stopped(definition.name, the_period)

    try:
        value, state = run_here(call, TickReport, what=f"{job} {the_period.label}",
                                stopped=stopped)
    except NotReady as exc:  # no flow run was created
        raise fail(exc, code=2) from None
    if as_json:
        print_json({**value.as_dict(), "flow_run_id": str(state.state_details.flow_run_id)})
    else:
        _print(value)
    if value.state_name() == "Failed":
        raise typer.Exit(1)
    if value.deciding_outcome() == "in-progress-elsewhere":
        _print_held(value)
        raise typer.Exit(HELD_ELSEWHERE_EXIT)


def _print_held(report: TickReport) -> None:
    """Which Runs another worker holds, until when, and what to do."""
    held = [s for s in report.subjects if s.outcome == "in-progress-elsewhere"]
    console(stderr=True).print(
        f"{len(held)} Run(s) of {report.name} held elsewhere: "
        + "; ".join(f"{s.subject} ({short_id(s.run_id)}) {s.error}" for s in held[:5])
        + ("; ..." if len(held) > 5 else "")
        + ". Wait for the lease to end, or take it over if that worker is dead: "
          "runledger runs release RUN (or --owner OWNER)", markup=False, highlight=False)


# The job and period are in the title; a narrow console loses the counts before anything else.
TICK_COLUMNS = [Col("subject", fold=FOLD), Col("outcome"), Col("run id"), Col("attempts", drop=1),
                Col("outbox rows", drop=2), Col("error", fold=FOLD, optional=True)]


def _print_stopped(job: str, period: Period) -> None:
    """After a Ctrl-C: each Run of the tick as the ledger has it now."""
    with ledger_session() as ledger:
        runs = [r for r in ledger.runs(job=job, limit=10_000) if r.period_start == period.start]
    done = sum(r.status == "completed" for r in runs)
    states = ", ".join(f"{r.subject} {r.status}{' (leased)' if r.owner else ''}"
                       for r in sorted(runs, key=lambda r: r.subject))
    again = (f". Run it again to finish: runledger run {job} --period {period.label}"
             if done < len(runs) or not runs else "")
    console(stderr=True).print(
        f"stopped {job} {period.label}: "
        + (f"{done} of {len(runs)} Run(s) completed; {states}" if runs
           else "no Run was registered") + again, markup=False, highlight=False)


def _print(report: TickReport) -> None:
    out = console()
    print_table(out, TICK_COLUMNS, [
        [s.subject, Text(s.outcome, style=STYLES[s.outcome]), short_id(s.run_id), str(s.attempts),
         str(s.outbox_rows), s.error or ""] for s in report.subjects], title=report.summary())
    for s in report.subjects:
        if s.pruned:  # a tombstone: the stored output is gone, and nothing was recomputed
            out.print(f"{s.subject}: output {s.pruned} (not recomputed)", markup=False,
                            highlight=False)
    if report.counts()["waiting"]:
        out.print(f"{report.counts()['waiting']} Run(s) {report.batches_text()}; "
                  "`runledger batches poll` settles the batch once it ended and finishes them",
                  markup=False, highlight=False)
