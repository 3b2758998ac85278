"""`runledger stats`: per job and UTC day, logical Runs completed apart from the attempts they
took, lease takeovers, duplicates suppressed, model calls and outbox messages (reads only)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated

import typer

from flows.cli.app import LOOK, app
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.tables import FOLD, Col, print_table
from flows.spend import cost_text
from flows.stats import DayStats, daily_stats
from store import InvalidInput, Ledger, RunledgerError

DEFAULT_DAYS = 7  # today and the six days before, when --since is not given
# What completed, what it cost and what was suppressed are read first; the finer splits go
# first on a narrow console (--json has them all).
# The job's name never wraps (a folded name reads as two jobs).
COLUMNS = [Col("job"), Col("day (UTC)"), Col("completed"), Col("revised", drop=6),
           Col("attempts", drop=1), Col("Runs in N attempts", drop=3), Col("takeovers", drop=4),
           Col("duplicates"), Col("elsewhere", drop=5), Col("calls paid"),
           Col("lost", drop=7), Col("reused", drop=7), Col("tokens", drop=8),
           Col("cost", fold=FOLD), Col("outbox", fold=FOLD, drop=2)]


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


def checked_window(job: str | None, since: str | None) -> datetime | None:
    """Check ``--job`` names a registered job and parse ``--since`` before the ledger opens;
    a bad one ends the command with its error."""
    try:
        if job is not None:
            from flows.registry import get_job  # lazy: the job registry loads every job

            get_job(job)
        return None if since is None else parse_since(since)
    except RunledgerError as exc:
        raise fail(exc) from exc


def window_start(ledger: Ledger, start: datetime | None) -> datetime:
    """``start``, or 00:00 UTC of the ledger's today minus ``DEFAULT_DAYS - 1`` days."""
    if start is not None:
        return start
    today = ledger.now().date()
    return datetime.combine(today - timedelta(days=DEFAULT_DAYS - 1), time(0), UTC)


@app.command("stats", rich_help_panel=LOOK)
def stats(
    job: Annotated[str | None, typer.Option("--job", help="Only this registered job.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="First UTC day, YYYY-MM-DD; default: six days before today.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Count per job and UTC day what completed, what it cost and what was suppressed.

    Logical Runs completed and revisions completed (revised), attempts started, attempts per
    completed Run (how many Runs took 1, 2, ... attempts), lease takeovers, duplicates
    suppressed (Runs a tick asked for again that were completed, or held by another worker:
    elsewhere), model calls paid (answered, failed or lost in flight), lost, answers reused
    from a checkpoint, tokens and cost (revisions' included), and the outbox messages queued
    that day by their status now. Reads only."""
    start = checked_window(job, since)
    with ledger_session() as ledger:
        start = window_start(ledger, start)
        days = daily_stats(ledger.activity(start, job), start, ledger.calls.since(start, job))
    if as_json:
        print_json([d.as_dict() for d in days])
        return
    if not days:
        console().print(f"nothing recorded since {start.date().isoformat()} (UTC)")
        return
    print_table(console(), COLUMNS, [
        [d.job, d.day.isoformat(), str(d.completed), str(d.revised), str(d.attempts),
         ", ".join(f"{runs} in {n}" for n, runs in sorted(d.attempts_per_completed.items()))
         or "-",
         str(d.lease_takeovers), str(d.duplicates), str(d.in_progress_elsewhere),
         str(d.model_calls), str(d.spend.lost + d.revision_spend.lost),
         str(d.spend.reused + d.revision_spend.reused),
         str(d.spend.tokens + d.revision_spend.tokens), _cost(d),
         ", ".join(f"{count} {status}" for status, count in sorted(d.messages.items())) or "-"]
        for d in days])


def _cost(day: DayStats) -> str:
    both = day.spend.cost + day.revision_spend.cost
    return cost_text(both, day.spend.unpriced + day.revision_spend.unpriced,
                     day.spend.unknown + day.revision_spend.unknown)
