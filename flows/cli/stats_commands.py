"""`runledger stats`: per job and UTC day, logical Runs completed apart from the attempts they
took, lease takeovers, duplicates suppressed, model calls and outbox messages (reads only)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated

import typer
from rich.console import Console

from flows.cli.app import app
from flows.cli.ledger_commands import fail, open_ledger, print_json
from flows.cli.tables import FOLD, Col, print_table
from store import InvalidInput, RunledgerError

DEFAULT_DAYS = 7  # today and the six days before, when --since is not given
# What completed, what it cost and what was suppressed are read first; the finer splits go
# first on a narrow console (--json has them all).
COLUMNS = [Col("job", fold=FOLD), Col("day (UTC)"), Col("completed"), Col("attempts"),
           Col("Runs in N attempts", drop=2), Col("takeovers", drop=3), Col("duplicates"),
           Col("elsewhere", drop=4), Col("model calls"), Col("outbox", fold=FOLD, drop=1)]


def parse_since(text: str) -> datetime:
    """The start (00:00 UTC) of the day ``text`` names as YYYY-MM-DD."""
    try:
        day = date.fromisoformat(text)
        if len(text) != len("YYYY-MM-DD"):
            raise ValueError(text)
    except ValueError:
        raise InvalidInput(f"--since must be a day as YYYY-MM-DD (UTC), such as 2026-11-24; "
                           f"got {text!r}") from None
    return datetime.combine(day, time(0), UTC)


@app.command("stats")
def stats(
    job: Annotated[str | None, typer.Option("--job", help="Only this registered job.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="First UTC day, YYYY-MM-DD; default: six days before today.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per job and UTC day: logical Runs completed, attempts started, attempts per completed Run
    (how many Runs took 1, 2, ... attempts), lease takeovers, duplicates suppressed (Runs a
    tick asked for again that were completed, or held by another worker: elsewhere), model
    calls, and the outbox messages queued that day by their status now. Reads only."""
    from flows.stats import daily_stats

    try:
        if job is not None:
            from flows.jobs import get_job

            get_job(job)
        start = None if since is None else parse_since(since)
    except RunledgerError as exc:
        raise fail(exc) from exc
    with open_ledger() as ledger:
        if start is None:
            today = ledger.now().date()
            start = datetime.combine(today - timedelta(days=DEFAULT_DAYS - 1), time(0), UTC)
        days = daily_stats(ledger.activity(start, job), start)
    if as_json:
        print_json([d.as_dict() for d in days])
        return
    if not days:
        Console().print(f"nothing recorded since {start.date().isoformat()} (UTC)")
        return
    print_table(Console(), COLUMNS, [
        [d.job, d.day.isoformat(), str(d.completed), str(d.attempts),
         ", ".join(f"{runs} in {n}" for n, runs in sorted(d.attempts_per_completed.items()))
         or "-",
         str(d.lease_takeovers), str(d.duplicates), str(d.in_progress_elsewhere),
         str(d.model_calls),
         ", ".join(f"{count} {status}" for status, count in sorted(d.messages.items())) or "-"]
        for d in days])
