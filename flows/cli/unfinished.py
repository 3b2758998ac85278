"""Unfinished Runs as on-call reads them in `runledger status` and `runledger overdue`: held
(who holds the lease, until when), stranded (a lease that ended), over-budget and pending, with a
summary line and what to do about each kind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.text import Text

from flows.cli.logical_runs import period_label
from flows.cli.tables import FOLD, Col, print_table, short_id, utc
from flows.jobs import Job
from store import UNFINISHED_KINDS, Ledger, UnfinishedRun

# Who holds a Run and until when is what the table is read for, and the run id is what `runs
# release` takes; the job (a status board names it) and the fence go first on a narrow console.
COLUMNS = [Col("job", fold=FOLD, drop=3), Col("subject", fold=FOLD), Col("period"), Col("state"),
           Col("owner", fold=FOLD), Col("lease until (UTC)"), Col("fence", drop=2),
           Col("run id", drop=1)]
STYLES = {"held": "yellow", "stranded": "bold red", "over-budget": "magenta",
          "waiting": "blue", "pending": "bold red"}
# What on-call does about each kind, printed under the table for the kinds it lists.
REMEDIES = {
    "held": "held: if its worker is dead, `runledger runs release RUN`; if not, wait",
    "stranded": "stranded: its lease ended; the next tick or `runledger reconcile JOB` runs it",
    "over-budget": "over-budget: raise the job's cap, then `runledger reconcile JOB`",
    "waiting": "waiting: its model call is in a provider's batch (`runledger batches list`); "
               "`runledger batches poll` settles it once the batch ended",
    "pending": "pending: the next tick or `runledger reconcile JOB` runs it",
}


def of_jobs(ledger: Ledger, jobs: Iterable[Job], now: datetime) -> list[UnfinishedRun]:
    """The unfinished Runs of ``jobs`` at their current versions (a Run of a version no longer
    deployed is never run again: `runledger runs list` shows it), oldest period first."""
    wanted = {(job.name, job.version) for job in jobs}
    if not wanted:
        return []
    only = next(iter(wanted))[0] if len(wanted) == 1 else None
    return [run for run in ledger.unfinished(job=only, now=now)
            if (run.job, run.version) in wanted]


def summary(runs: Sequence[UnfinishedRun]) -> str:
    """``3 unfinished Runs: 1 held, 1 over-budget, 1 pending``, or ``no unfinished Run``."""
    if not runs:
        return "no unfinished Run"
    counts = Counter(run.kind for run in runs)
    parts = ", ".join(f"{counts[kind]} {kind}" for kind in UNFINISHED_KINDS if counts[kind])
    return f"{len(runs)} unfinished Run{'s' if len(runs) > 1 else ''}: {parts}"


def fields(run: UnfinishedRun) -> dict[str, Any]:
    """One unfinished Run as JSON (times in UTC)."""
    return {"run_id": run.run_id, "job": run.job, "subject": run.subject,
            "period": period_label(run), "period_start": run.period_start.isoformat(),
            "version": run.version, "revision": run.revision, "state": run.kind,
            "status": run.status, "owner": run.owner,
            "lease_until": run.lease_expires_at.isoformat() if run.lease_expires_at else None,
            "fence": run.fence, "attempts": run.attempts, "error": run.error}


def _row(run: UnfinishedRun) -> list[str | Text]:
    return [run.job, run.subject, period_label(run), Text(run.kind, style=STYLES[run.kind]),
            run.owner or "-", utc(run.lease_expires_at) if run.status == "running" else "-",
            str(run.fence), short_id(run.run_id)]


def print_unfinished(out: Console, runs: Sequence[UnfinishedRun]) -> None:
    """The table of ``runs`` (none when empty), its summary line and a remedy per kind listed."""
    if runs:
        print_table(out, COLUMNS, [_row(run) for run in runs])
    out.print(summary(runs), markup=False, highlight=False)
    kinds = {run.kind for run in runs}
    for kind in UNFINISHED_KINDS:
        if kind in kinds:
            out.print(f"  {REMEDIES[kind]}", markup=False, highlight=False)
