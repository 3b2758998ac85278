"""`runledger init`: scaffold a team's repository for its own jobs (flows/scaffold)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.app import SET_UP, app
from flows.cli.output import fail
from store import RunledgerError


@app.command("init", rich_help_panel=SET_UP)
def init(
    job: Annotated[str, typer.Option("--job", help="The job's name, e.g. team-digest.")],
    package: Annotated[str | None, typer.Option(
        "--package", help="The Python package the job module goes in (default: the folder's "
                          "name, dashes as underscores).")] = None,
    cadence: Annotated[str, typer.Option(
        "--cadence", help="hourly, daily, weekly, monthly or a 5-field cron.")] = "daily",
    timezone: Annotated[str, typer.Option("--timezone", help="IANA timezone.")] = "UTC",
    due_minutes: Annotated[int, typer.Option(
        "--due-minutes", min=0, help="Minutes after a period starts that it is due (the "
                                     "schedule's slot); default 420 (07:00 for daily).")] = 420,
    runledger: Annotated[str, typer.Option(
        "--runledger", help="The runledger dependency: a requirement (runledger>=0.1) or the "
                            "path of a wheel (written as a uv source).")] = "runledger",
    folder: Annotated[Path, typer.Option("--folder", help="The repository.")] = Path("."),
) -> None:
    """Scaffold a repository for your own jobs.

    A job module, its entry point in pyproject.toml, a prefect.yaml, a README section and a test that runs the job twice.
    Nothing is overwritten; then `uv sync` and `uv run pytest`."""
    from flows.scaffold import Scaffold

    root = folder.resolve()
    try:
        written = Scaffold(root, job, package or root.name.lower().replace("-", "_"),
                           cadence=cadence, timezone=timezone,
                           due=timedelta(minutes=due_minutes), runledger=runledger).write()
    except RunledgerError as exc:
        raise fail(exc, code=2) from None
    for line in written:
        typer.echo(line)
    typer.echo("next: uv sync && uv run pytest   (then README.md: deploy, serve, check)")
