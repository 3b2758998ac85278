"""`runledger run JOB`: one tick of a job, in this process, printed subject by subject."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.text import Text

from flows.cli.app import api_refused, app
from flows.cli.ledger_commands import fail, open_ledger, print_json
from flows.cli.tables import FOLD, Col, print_table, short_id

if TYPE_CHECKING:
    from prefect import State

    from flows.outcomes import TickReport

# Prefect's temporary server (no PREFECT_API_URL): the settings runledger gives it unless the
# user chose a value. On a busy machine it takes more than its default 20 s to start. Its
# analytics would phone home from machines that may have no internet, and its telemetry
# heartbeat competes for its SQLite database: "database is locked" tracebacks and "Failed to
# send telemetry" ERROR lines on the terminal of a run that worked. Stopping it at the end
# cancels its services mid-flush, which they (and SQLAlchemy's pool, through the root logger)
# log as ERROR tracebacks: CancelledError in the task run recorder, seen under load. Its logs
# stay quiet but for CRITICAL; what matters to the user reaches them through the flow run's
# state and this process's logs, whose logging Prefect set up when it was imported, before
# these variables are set.
EPHEMERAL_SERVER = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": 90,
    "PREFECT_SERVER_ANALYTICS_ENABLED": False,
    "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
    "PREFECT_LOGGING_ROOT_LEVEL": "CRITICAL",
}
STYLES = {"new": "green", "duplicate": "cyan", "in-progress-elsewhere": "yellow",
          "lease-lost": "yellow", "stopped": "yellow", "failed": "bold red"}


def _ephemeral_server() -> AbstractContextManager[Any]:
    """Apply EPHEMERAL_SERVER where the user set nothing: in the environment, which covers the
    server's process and threads that start without Prefect's settings context, and in the
    settings context, which covers this thread."""
    chosen = {name: value for name, value in EPHEMERAL_SERVER.items() if not os.environ.get(name)}
    if not chosen:
        return nullcontext()
    for name, value in chosen.items():
        os.environ[name] = str(value).lower()
    import prefect.settings

    # PREFECT_LOGGING_* are overrides of Prefect's logging config, read from the environment
    # only: not settings of the context.
    return prefect.settings.temporary_settings(updates={
        getattr(prefect.settings, name): value for name, value in chosen.items()
        if hasattr(prefect.settings, name)})


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
    with _ephemeral_server():
        from flows.pipeline import run_job

        # Prefect types a flow call as an Awaitable (it is a coroutine) and, for a flow that
        # returns a State, its final state as State[State]: it ends in the State returned.
        try:
            state = asyncio.run(cast("Coroutine[Any, Any, State[Any]]", run_job(
                job=job, subjects=subject or None, period=period, return_state=True)))
        except Exception as exc:
            refused = api_refused(exc)
            if refused is None:
                raise
            raise fail(RuntimeError(refused)) from None
    from flows.outcomes import TickReport

    value = state.result(raise_on_failure=False)
    if not isinstance(value, TickReport):
        error = value if isinstance(value, BaseException) else RuntimeError(state.message)
        raise fail(error)
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
