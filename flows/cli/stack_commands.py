"""Stack commands: `serve` (every deployment with its schedule, one process) and
`stack up|automations` (the local stack without Docker)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from flows.cli.app import RUN_WORK, api_refused, app, stack_app
from flows.cli.output import console, error, fail
from flows.stack.auth import StackAuth
from flows.stack.automations import (
    HEARTBEAT_SECONDS,
    install_alerts,
    install_crash_detector,
    notification_block,
)
from flows.stack.config import StackConfig
from flows.stack.local import up
from flows.stack.prefect_server import client
from flows.stack.work_pool import DEFAULT_POOL
from store import RunledgerError


@app.command("serve", rich_help_panel=RUN_WORK)
def serve(
    limit: int | None = typer.Option(None, "--limit", min=1,
                                     help="Most flow runs executed at once; default: no limit, "
                                          "as Prefect's serve (each is a process of its own)."),
    file: Annotated[Path | None, typer.Option(
        "--file", exists=True, dir_okay=False,
        help="A prefect.yaml to serve instead (entrypoints flows.entrypoints.<flow>, or "
             "path.py:flow from the current folder); default: runledger's deployments plus "
             "one per registered job on the schedule its Job derives.")] = None,
) -> None:
    """Serve deployments with their schedules, in this process.

    By default runledger's own (reconcile, deliver-outbox, prune, backfill, revise) and one
    per registered job.

    Needs PREFECT_API_URL. Every job's schedule is checked against its Job first. On exit
    Prefect pauses the deployments and drops their future scheduled runs."""
    from deployments.project import PREFECT_FILE, load_deployments
    from deployments.serve import serve_all
    from flows.deployment_check import schedule_problems, with_every_job

    try:
        specs = load_deployments(file.resolve()) if file else with_every_job(
            load_deployments(PREFECT_FILE))
        problems = schedule_problems(specs, datetime.now(UTC))
    except RunledgerError as exc:
        raise fail(exc, code=2) from None
    if problems:
        for problem in problems:
            error(problem)
        raise typer.Exit(2)
    serve_all(specs, limit=limit)


@stack_app.command("up")
def stack_up(
    home: Annotated[Path, typer.Option(
        "--home", help="Folder for Prefect's files, logs and the mail folder.")] = Path(".runledger"),
    host: str = typer.Option(
        "127.0.0.1", "--host",
        help="Address of the Prefect server. Anything but loopback needs "
             "PREFECT_SERVER_API_AUTH_STRING=user:password (docs/security.md); the SMTP sink "
             "always listens on 127.0.0.1."),
    port: int = typer.Option(4200, "--port", min=1, max=65535, help="Port of the Prefect UI/API."),
    workers: int = typer.Option(
        0, "--workers", min=0,
        help="0: `runledger serve`; N: a process work pool, `prefect deploy`, N workers."),
    pool: str = typer.Option(DEFAULT_POOL, "--pool", help="Work pool name (with --workers)."),
    kickoff: bool = typer.Option(True, "--kickoff/--no-kickoff",
                                 help="Run the reference job and one delivery pass at start."),
    prefect_db: str | None = typer.Option(
        None, "--prefect-db", envvar="PREFECT_API_DATABASE_CONNECTION_URL",
        help="Prefect's database (postgresql+asyncpg://...); default SQLite in --home."),
    redis: str | None = typer.Option(
        None, "--redis",
        help="The Prefect server's events through Redis (prefect-redis), e.g. "
             "redis://127.0.0.1:6379/1, a db no other server uses; default in memory, which "
             "drops events when a large tick sends them faster than the server records them "
             "(docs/how-to/scale-out.md)."),
) -> None:
    """Start the whole local stack and run it until Ctrl-C, which stops everything."""
    try:
        config = StackConfig(home=home.resolve(), host=host, port=port, workers=workers,
                             pool=pool, kickoff=kickoff, prefect_database_url=prefect_db,
                             redis_url=redis, auth=StackAuth.from_env(os.environ))
        up(config, say=typer.echo)
    except RunledgerError as exc:
        raise fail(exc) from None


@stack_app.command("automations")
def stack_automations(
    within: float = typer.Option(
        3 * HEARTBEAT_SECONDS, "--within", min=HEARTBEAT_SECONDS + 1,
        help="Seconds without any event after a heartbeat before a flow run counts as crashed."),
    notify_block: str | None = typer.Option(
        None, "--notify-block",
        help="The Prefect notification block alerts go through, as `prefect block ls` names "
             "it (custom-webhook/ops, slack-webhook/oncall) or by its name alone. With it, "
             "also installs the overdue/give-up alert and each job's dead man's switch."),
) -> None:
    """Install runledger's automations on the server at PREFECT_API_URL, or update them.

    The crash detector (workers must send heartbeats: PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30)
    and, with --notify-block, the alerts: a notification
    per overdue or given-up occurrence, and per registered job one when no tick completed
    every subject within its cadence plus grace (the server sends it even when the
    scheduler, the reconciler and every worker are down)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise fail("set PREFECT_API_URL to your server's API")
    try:
        with client(url) as api:
            try:
                block = notification_block(api, notify_block) if notify_block else None
            except RunledgerError as exc:
                raise fail(exc) from None
            install_crash_detector(api, within)
            out = console()
            out.print(f"installed the crash detector on {url} (within {within:.0f} s)")
            if block is not None:
                from flows.registry import registered_jobs

                names = install_alerts(api, registered_jobs().values(), block.id,
                                       datetime.now(UTC))
                out.print(f"installed the alerts through {escape(notify_block or '')}:")
                for name in names:
                    out.print(f"  {escape(name)}")
    except Exception as exc:
        refused = api_refused(exc)
        if refused is None:
            raise
        raise fail(refused) from None
