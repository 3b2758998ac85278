"""`runledger run JOB`: one tick of a job, in this process, printed subject by subject."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from flows.cli.app import app
from flows.cli.ledger_commands import fail, open_ledger, print_json

if TYPE_CHECKING:
    from prefect import State

    from flows.outcomes import TickReport

EPHEMERAL_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
MIN_EPHEMERAL_TIMEOUT = 90
STYLES = {"new": "green", "duplicate": "cyan", "in-progress-elsewhere": "yellow",
          "lease-lost": "yellow", "stopped": "yellow", "failed": "bold red"}


def _ephemeral_timeout() -> AbstractContextManager[Any]:
    """Without PREFECT_API_URL Prefect starts a local server; on a busy machine that takes more
    than its default 20 s, so allow 90 s unless the user chose a value. The environment covers
    threads that start without Prefect's settings context; the context covers this one."""
    if os.environ.get(EPHEMERAL_TIMEOUT):
        return nullcontext()
    os.environ[EPHEMERAL_TIMEOUT] = str(MIN_EPHEMERAL_TIMEOUT)
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    return temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS:
                                       MIN_EPHEMERAL_TIMEOUT})


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
    is created or migrated first (RUNLEDGER_DATABASE_URL)."""
    ledger = open_ledger()
    try:
        ledger.migrate()
    finally:
        ledger.close()
    with _ephemeral_timeout():
        from flows.pipeline import run_job

        # Prefect types a flow call as an Awaitable (it is a coroutine) and, for a flow that
        # returns a State, its final state as State[State]: it ends in the State returned.
        state = asyncio.run(cast("Coroutine[Any, Any, State[Any]]", run_job(
            job=job, subjects=subject or None, period=period, return_state=True)))
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


def _print(report: TickReport) -> None:
    console = Console()
    table = Table("subject", "outcome", "run id", "attempts", "outbox rows", "error",
                  title=report.summary())
    for s in report.subjects:
        style = STYLES[s.outcome]
        table.add_row(s.subject, f"[{style}]{s.outcome}[/]", s.run_id[:12], str(s.attempts),
                      str(s.outbox_rows), s.error or "")
    console.print(table)
