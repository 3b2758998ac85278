"""Delivery commands: `deliver` (one dispatcher pass per channel, the same code as the
deliver-outbox flow) and `sink` (the local SMTP sink); the `outbox` commands are in
outbox_commands.py."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli.app import RUN_WORK, SET_UP, app
from flows.cli.output import console, fail, ledger_session, print_json
from flows.delivery.dispatcher import Dispatcher
from flows.delivery.report import DeliveryReport
from flows.delivery.settings import DeliverySettings
from flows.errors import DeliveryConfigurationError
from flows.mail.sink import Fault, serve
from store import CHANNELS, Ledger, RunledgerError

CONFIGURATION_EXIT = 2


@app.command("deliver", rich_help_panel=RUN_WORK)
def deliver(
    batch_size: int = typer.Option(100, "--batch-size", min=1,
                                   help="Messages claimed per batch (one lease each)."),
    max_seconds: float = typer.Option(60.0, "--max-seconds", min=0.1,
                                      help="Stop claiming new batches after this many seconds."),
    channel: str | None = typer.Option(
        None, "--channel", help=f"Deliver only this channel ({', '.join(CHANNELS)}); default: "
                                "every channel of RUNLEDGER_DELIVERY_CHANNELS."),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every outcome that is not sent."),
) -> None:
    """Deliver due outbox messages once (until none is due), like one deliver-outbox flow run."""
    if channel is not None and channel not in CHANNELS:
        raise typer.BadParameter(f"must be one of {', '.join(CHANNELS)}, got {channel!r}",
                                 param_hint="--channel")
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    with ledger_session() as ledger:
        try:
            reports = asyncio.run(_passes(ledger, channel, batch_size, max_seconds))
            waiting = {} if channel else _not_delivered(ledger)
        except DeliveryConfigurationError as exc:
            raise fail(exc, CONFIGURATION_EXIT, label="configuration error") from None
    if as_json:
        total: Counter[str] = Counter()
        for report in reports:
            total.update(report.counts)
        print_json(dict(total) if len(reports) == 1 else
                   {"total": dict(total), **{r.channel: r.counts for r in reports}})
        return
    out = console()
    for report in reports:
        out.print(f"{report.channel}: delivered in {report.seconds:.1f} s: "
                  f"{escape(report.summary())}")
        if report.stopped:
            out.print(f"[yellow]stopped early:[/] {escape(report.stopped)}")
        rows = report.rows()
        if rows:
            table = Table(*rows[0], title=f"{report.channel}: not sent")
            for row in rows:
                table.add_row(*row.values())
            out.print(table)
    delivered = DeliverySettings().channels
    for name, count in waiting.items():
        out.print(f"[yellow]not delivered:[/] {count}{'+' if count >= WAITING_SHOWN else ''} "
                  f"{name} message(s) wait in the outbox: RUNLEDGER_DELIVERY_CHANNELS="
                  f"{delivered} does not deliver {name}; add it (or run deliver --channel "
                  f"{name})", highlight=False)


WAITING_SHOWN = 1000


def _not_delivered(ledger: Ledger) -> dict[str, int]:
    """Messages waiting (pending or retry) per channel RUNLEDGER_DELIVERY_CHANNELS leaves out,
    counted up to WAITING_SHOWN."""
    delivered = DeliverySettings().channel_list
    found = {name: sum(len(ledger.outbox.messages(status=status, channel=name,
                                                 limit=WAITING_SHOWN))
                       for status in ("pending", "retry"))
             for name in CHANNELS if name not in delivered}
    return {name: count for name, count in found.items() if count}


async def _passes(ledger: Ledger, channel: str | None, batch_size: int,
                  max_seconds: float) -> list[DeliveryReport]:
    """One pass per channel, side by side, as the deliver-outbox flow runs them."""
    dispatchers = ([Dispatcher.from_settings(ledger, channel=channel)] if channel
                   else Dispatcher.for_channels(ledger))
    return list(await asyncio.gather(*[d.run_pass(batch_size=batch_size, max_seconds=max_seconds)
                                       for d in dispatchers]))


@app.command("sink", rich_help_panel=SET_UP)
def sink(
    maildir: Annotated[Path, typer.Option("--maildir", help="Folder for .eml files and stats.json.")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")],
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    dedupe: bool = typer.Option(False, "--dedupe", help="Store one copy per Message-ID."),
    faults: Annotated[list[str] | None, typer.Option(
        "--fault",
        help="Inject a fault: STAGE:ACTION[:TIMES[:CHANCE]], optionally @RECIPIENT; e.g. rcpt:451:2, "
             "data:drop, data:slow=3:always, rcpt:451:always:0.05 (a random 5%). Repeatable.",
    )] = None,
) -> None:
    """Run an SMTP sink in the foreground until SIGINT/SIGTERM (for tests and the local stack)."""
    try:
        parsed = [Fault.parse(spec) for spec in faults or []]
    except RunledgerError as exc:
        raise typer.BadParameter(str(exc), param_hint="--fault") from None
    out = console()
    stats = serve(host, port, maildir, dedupe=dedupe, faults=parsed, announce=out.print)
    out.print(f"sink stopped: {stats}")
