"""Delivery commands: `deliver` (one dispatcher pass, the same code as the deliver-outbox flow),
`outbox requeue|show`, and `sink` (the local SMTP sink)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from flows.cli.app import app, outbox_app
from flows.cli.ledger_commands import fail, open_ledger, print_json
from flows.delivery.dispatcher import Dispatcher
from flows.mail.errors import MailConfigurationError
from flows.mail.letter import message_id_for
from flows.mail.sink import Fault, serve
from store import RunledgerError

console = Console()
CONFIGURATION_EXIT = 2


@app.command("deliver")
def deliver(
    batch_size: int = typer.Option(100, "--batch-size", min=1,
                                   help="Messages claimed per batch (one lease each)."),
    max_seconds: float = typer.Option(60.0, "--max-seconds", min=0.1,
                                      help="Stop claiming new batches after this many seconds."),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every outcome that is not sent."),
) -> None:
    """Deliver due outbox messages once (until none is due), like one deliver-outbox flow run."""
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    ledger = open_ledger()
    try:
        dispatcher = Dispatcher.from_settings(ledger)
        report = asyncio.run(dispatcher.run_pass(batch_size=batch_size, max_seconds=max_seconds))
    except MailConfigurationError as exc:
        Console(stderr=True).print(f"[bold red]configuration error:[/] {exc}")
        raise typer.Exit(CONFIGURATION_EXIT) from None
    finally:
        ledger.close()
    if as_json:
        print_json(report.counts)
        return
    counts = ", ".join(f"{n} {name}" for name, n in report.counts.items() if n)
    console.print(f"delivered in {report.seconds:.1f} s: {counts or 'nothing was due'}")
    if report.stopped:
        console.print(f"[yellow]stopped early:[/] {report.stopped}")
    rows = report.rows()
    if rows:
        table = Table(*rows[0], title="not sent")
        for row in rows:
            table.add_row(*row.values())
        console.print(table)


@outbox_app.command("requeue")
def outbox_requeue(message_id: str = typer.Argument(
        ..., help="The outbox message id (its key), or a unique prefix of it (4+ characters).")
) -> None:
    """Make a retry, uncertain or dead message due now; it is resent with the same key."""
    ledger = open_ledger()
    try:
        message_id = ledger.resolve_message_id(message_id)
        before = ledger.message(message_id)
        message = ledger.requeue_message(message_id)
    except RunledgerError as exc:
        raise fail(exc) from exc
    finally:
        ledger.close()
    console.print(f"message {message.message_id} to {message.recipient} is {message.status}, "
                  f"due now, Message-ID {message_id_for(message.message_id)}")
    if before is not None and before.status == "uncertain":
        console.print("[yellow]note:[/] it was uncertain: the receiver may already have it; the "
                      "copy carries the same Message-ID so it can be recognised")


@outbox_app.command("show")
def outbox_show(
    message_id: str = typer.Argument(
        ..., help="The outbox message id (its key), or a unique prefix of it (4+ characters)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one outbox message and every delivery attempt."""
    ledger = open_ledger()
    try:
        message_id = ledger.resolve_message_id(message_id)
        message = ledger.message(message_id)
        attempts = ledger.delivery_attempts(message_id)
    except RunledgerError as exc:
        raise fail(exc) from exc
    finally:
        ledger.close()
    if message is None:
        raise fail(RunledgerError(f"no outbox message with id {message_id!r}"))
    if as_json:
        print_json({"message": message.model_dump(mode="json"),
                    "attempts": [a.model_dump(mode="json") for a in attempts]})
        return
    console.print(f"[bold]{message.recipient}[/] {message.subject!r}\nmessage {message.message_id} "
                  f"(Message-ID {message_id_for(message.message_id)}) run {message.run_id}\n"
                  f"status [bold]{message.status}[/], attempts {message.attempts}, next attempt "
                  f"{message.next_attempt_at or '-'}, last error {message.last_error or '-'}")
    table = Table("attempt", "owner", "started", "finished", "outcome", "reply", "provider id")
    for a in attempts:
        table.add_row(str(a.attempt), a.owner, str(a.started_at), str(a.finished_at), a.outcome,
                      f"{a.reply_code or ''} {a.reply_text or ''}".strip(),
                      a.provider_message_id or "")
    console.print(table)


@app.command("sink")
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
    stats = serve(host, port, maildir, dedupe=dedupe, faults=parsed, announce=console.print)
    console.print(f"sink stopped: {stats}")
