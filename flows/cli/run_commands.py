"""`runledger run JOB`: one tick of a job, in this process, printed subject by subject."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.text import Text

from flows.cli.app import app
from flows.cli.flow_runs import run_here
from flows.cli.ledger_commands import open_ledger, print_json
from flows.cli.tables import FOLD, Col, print_table, short_id

if TYPE_CHECKING:
    from prefect import State

    from flows.outcomes import TickReport

STYLES = {"new": "green", "duplicate": "cyan", "in-progress-elsewhere": "yellow",
          "lease-lost": "yellow", "stopped": "yellow", "failed": "bold red"}


@app.command("run")
def run(
    job: Annotated[str, typer.Argument(help="A registered job, e.g. competitor-summary.")],
    subject: Annotated[list[str] | None, typer.Option(
        "--subject", "-s", help="A subject to run (repeatable); default: all of the job's.")] = None,
    period: Annotated[str | None, typer.Option(
        "--period",
        help="A date YYYY-MM-DD in the job's timezone, or an ISO datetime with an offset; "
             "default: the period containing now.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Run one tick of JOB now through the run-job flow and print each subject's outcome.

    Uses the Prefect server at PREFECT_API_URL, or a temporary local one. The ledger schema
    and the jobs' own tables are created or migrated first (RUNLEDGER_DATABASE_URL), as by
    `runledger db upgrade`."""
    from flows.jobs import upgrade_ledger

    ledger = open_ledger()
    try:
        upgrade_ledger(ledger)
    finally:
        ledger.close()
    from flows.outcomes import TickReport

    def call() -> Coroutine[Any, Any, State[Any]]:
        from flows.pipeline import run_job

        return cast("Coroutine[Any, Any, State[Any]]", run_job(
            job=job, subjects=subject or None, period=period, return_state=True))

    value, state = run_here(call, TickReport)
    if as_json:
        print_json({**value.as_dict(), "flow_run_id": str(state.state_details.flow_run_id)})
    else:
        _print(value)
    if value.state_name() == "Failed":
        raise typer.Exit(1)


# The job and period are in the title; a narrow console loses the counts before anything else.
TICK_COLUMNS = [Col("subject", fold=FOLD), Col("outcome"), Col("run id"), Col("attempts", drop=1),
                Col("outbox rows", drop=2), Col("error", fold=FOLD, optional=True)]


def _print(report: TickReport) -> None:
    print_table(Console(), TICK_COLUMNS, [
        [s.subject, Text(s.outcome, style=STYLES[s.outcome]), short_id(s.run_id), str(s.attempts),
         str(s.outbox_rows), s.error or ""] for s in report.subjects], title=report.summary())
    for s in report.subjects:
        if s.pruned:  # a tombstone: the stored output is gone, and nothing was recomputed
            Console().print(f"{s.subject}: output {s.pruned} (not recomputed)", markup=False,
                            highlight=False)
