"""`runledger check`: the setup's checklist (flows/checkup.py), one screen, exit status 1 when
anything failed."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli.app import SET_UP, app
from flows.cli.output import console

MARKS = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]",
         "skip": "[dim]skip[/]"}


@app.command("check", rich_help_panel=SET_UP)
def check(
    folder: Annotated[Path, typer.Option(
        "--folder", help="Where a prefect.yaml to check may be.")] = Path("."),
) -> None:
    """Check this setup, one line per finding.

    The ledger (RUNLEDGER_DATABASE_URL) reachable and migrated, the registered jobs and their
    packages, each run-job deployment's schedule against its Job (./prefect.yaml and the
    server in PREFECT_API_URL), the work pools, the mail and model endpoints. Exit status 1
    when anything failed."""
    from prefect.settings import PREFECT_API_URL

    from flows.checkup import check_all

    findings = check_all(PREFECT_API_URL.value(), datetime.now(UTC), folder.resolve())
    out = console()
    # A grid: a long detail folds under its own column, the marks and topics stay aligned.
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for finding in findings:
        grid.add_row(MARKS[finding.status], finding.topic, escape(finding.detail))
    out.print(grid, highlight=False)
    failed = sum(f.status == "fail" for f in findings)
    out.print(f"{failed} failed, {sum(f.status == 'warn' for f in findings)} warning(s), "
                  f"{sum(f.status == 'ok' for f in findings)} ok", highlight=False)
    if failed:
        raise typer.Exit(1)
