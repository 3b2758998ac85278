"""Stack commands: `serve` (every deployment with its schedule, one process) and
`stack up|automations` (the local stack without Docker)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from flows.cli.app import api_refused, app
from flows.stack.auth import StackAuth
from flows.stack.automations import (
    HEARTBEAT_SECONDS,
    install_alerts,
    install_crash_detector,
    notification_block,
)
from flows.stack.local import StackConfig, up
from flows.stack.prefect_server import client
from flows.stack.work_pool import DEFAULT_POOL
from store import RunledgerError

console = Console()
stack_app = typer.Typer(help="The local stack: Prefect server, SMTP sink, serve or workers.",
                        no_args_is_help=True)
app.add_typer(stack_app, name="stack")


@app.command("serve")
def serve(
    limit: int | None = typer.Option(None, "--limit", min=1,
                                     help="Most flow runs executed at once."),
    file: Annotated[Path | None, typer.Option(
        "--file", exists=True, dir_okay=False,
        help="Another prefect.yaml (its entrypoints are paths from the project root); "
             "default deployments/prefect.yaml.")] = None,
) -> None:
    """Serve every deployment of deployments/prefect.yaml with its schedules (needs
    PREFECT_API_URL). On exit Prefect pauses them and drops their future scheduled runs."""
    from deployments.project import PREFECT_FILE
    from deployments.serve import serve_all

    serve_all(limit=limit, path=(file or PREFECT_FILE).resolve())


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
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1) from None


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
    """Install runledger's automations on the server in PREFECT_API_URL, or update them in
    place: the crash detector (workers must send heartbeats:
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30) and, with --notify-block, the alerts: a notification
    per overdue or given-up occurrence, and per registered job one when no tick completed
    every subject within its cadence plus grace (the server sends it even when the
    scheduler, the reconciler and every worker are down)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        Console(stderr=True).print("[bold red]error:[/] set PREFECT_API_URL to your server's API")
        raise typer.Exit(1)
    try:
        with client(url) as api:
            try:
                block = notification_block(api, notify_block) if notify_block else None
            except RunledgerError as exc:
                Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}")
                raise typer.Exit(1) from None
            install_crash_detector(api, within)
            console.print(f"installed the crash detector on {url} (within {within:.0f} s)")
            if block is not None:
                from flows.jobs import registered_jobs

                names = install_alerts(api, registered_jobs().values(), block.id,
                                       datetime.now(UTC))
                console.print(f"installed the alerts through {escape(notify_block or '')}:")
                for name in names:
                    console.print(f"  {escape(name)}")
    except Exception as exc:
        refused = api_refused(exc)
        if refused is None:
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {refused}")
        raise typer.Exit(1) from None
