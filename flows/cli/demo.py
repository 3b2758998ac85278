"""`runledger demo`: one logical run through the ledger, then the same run again, so the
idempotency shows: the repeat gets the stored result back and queues nothing new."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

import typer

from flows.cli.app import SET_UP, app
from flows.cli.output import console, ledger_session
from store import Ledger, OutboxMessage, Period, RunIdentity


@app.command("demo", rich_help_panel=SET_UP)
def demo(
    database_url: str | None = typer.Option(
        None, "--database-url", help="Ledger URL (default: $RUNLEDGER_DATABASE_URL, else ./runledger.db)."
    ),
) -> None:
    """Run today's demo Run on the ledger, then repeat it to show the duplicate is returned."""
    with ledger_session(url=database_url) as ledger:
        _demo(ledger)


def _demo(ledger: Ledger) -> None:
    ledger.migrate()
    out = console()
    out.print(f"ledger: {ledger.engine.url.render_as_string()} ({ledger.dialect}), schema migrated")
    period = Period.containing(datetime.now(UTC), "daily", "UTC")
    identity = RunIdentity("demo", "hello", period.start, "v1")
    owner = f"{socket.gethostname()}:{os.getpid()}"
    message = OutboxMessage("demo@example.com", f"Demo digest {period.label}", "Hello from runledger.")

    run = ledger.register(identity, params={"recipients": [message.recipient]})
    out.print(f"1. register {identity.job}/{identity.subject}/{period.label}: run {run.run_id[:12]} "
                  f"is [bold]{run.status}[/]")
    claim = ledger.claim(run.run_id, owner, timedelta(minutes=5))
    if claim is None:
        out.print("2. claim: no lease, the Run is already completed or leased elsewhere "
                      "(run the demo again tomorrow for a fresh Run)")
    else:
        out.print(f"2. claim as {owner}: fence {claim.fence}, lease until "
                      f"{claim.lease_expires_at:%H:%M:%S} UTC by the database clock")
        raw = ledger.save_input(claim, {"items": ["alpha", "beta"]})
        out.print(f"3. save_input: stored raw input {raw}")
        done = ledger.complete(claim, {"summary": f"{len(raw['items'])} items"}, [message])
        out.print(f"4. complete: new={done.new}, output {done.run.output}, "
                      f"{len(ledger.outbox.messages(run_id=run.run_id))} outbox row queued")

    out.print("[bold]repeat the same logical run[/] (a retry, an overlap or a manual rerun):")
    again = ledger.register(identity, params={"recipients": [message.recipient]})
    out.print(f"5. register: same run {again.run_id[:12]}, status [bold]{again.status}[/], "
                  f"{len(ledger.runs(job='demo'))} demo row(s) in the ledger for all days")
    retry = ledger.claim(again.run_id, owner, timedelta(minutes=5))
    out.print(f"6. claim: {'granted' if retry else 'none, the Run is completed: no model call'}")
    if claim is not None:
        replay = ledger.complete(claim, {"summary": "a different answer"}, [message])
        out.print(f"7. complete again: new={replay.new}, the stored output {replay.run.output} "
                      "is returned (the different answer is dropped)")
    out.print(f"outbox rows for this run: {len(ledger.outbox.messages(run_id=again.run_id))} "
                  "(one per recipient, whatever the retries)")
