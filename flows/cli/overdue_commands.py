"""`runledger overdue`: what the jobs owe that is late, and why, from the ledger as reconcile
sees it (a dry run: it writes nothing), and every unfinished Run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import typer
from rich.text import Text

from flows.cli.app import LOOK, app
from flows.cli.output import console, ledger_session, print_json
from flows.cli.tables import FOLD, Col, print_table, short_id, utc
from flows.cli.unfinished import fields, of_jobs, print_unfinished
from flows.jobs import Job
from flows.occurrences.plan import Step
from flows.occurrences.prepare import prepare
from flows.registry import get_job, registered_jobs
from store import HeldMessage

ERROR_EXIT = 2  # 1 says something is overdue or unfinished

# What is owed is read by job, subject, period and why; the state is in the why, the due time
# follows from the period.
COLUMNS = [Col("job", fold=FOLD), Col("subject", fold=FOLD), Col("period"),
           Col("state", drop=2), Col("why", fold=FOLD), Col("due", drop=1), Col("late")]
# The kind of trouble a person reads first, per plan state.
WHY = {
    "missed": "never started",
    "upcoming": "never started",
    "stranded": "stranded",
    "failed": "failed",
    "running": "still running",
    "waiting": "waiting on a batch",
    "skipped": "skipped by policy",
}


@dataclass(frozen=True)
class Late:
    """One owed occurrence past its due time that is not completed, or one skipped by policy."""

    job: Job
    step: Step
    now: datetime

    @property
    def late(self) -> timedelta:
        return self.now - self.step.owed.due_at

    @property
    def why(self) -> str:
        kind, reason = WHY[self.step.state], self.step.reason
        for prefix in (f"{self.step.state}: ", f"{kind}: "):
            reason = reason.removeprefix(prefix)
        return f"{kind}: {reason}"

    def row(self) -> list[str | Text]:
        owed = self.step.owed
        due = owed.due_at.astimezone(ZoneInfo(self.job.timezone))
        style = "bold red" if self.step.overdue else ""
        return [self.job.name, owed.subject, owed.period.label, self.step.state,
                Text(self.why, style=style), due.strftime("%Y-%m-%d %H:%M %Z"),
                Text("-" if self.step.state == "skipped" else duration(self.late), style=style)]

    def as_dict(self) -> dict[str, Any]:
        owed = self.step.owed
        return {"job": self.job.name, "subject": owed.subject, "period": owed.period.label,
                "period_start": owed.period.start.isoformat(), "state": self.step.state,
                "action": self.step.action, "why": self.why, "reason": self.step.reason,
                "overdue": self.step.overdue, "due_at": owed.due_at.isoformat(),
                "late_seconds": int(self.late.total_seconds()), "run_id": owed.identity.run_id}


def late_steps(job: Job, steps: list[Step], now: datetime) -> list[Late]:
    """The overdue steps (not completed or skipped by due time plus grace), those missed,
    stranded or failed past their due time within the grace, and the skipped ones."""
    return [Late(job, s, now) for s in steps
            if s.overdue or s.state == "skipped"
            or (s.state in ("missed", "stranded", "failed") and now > s.owed.due_at)]


HOLD_COLUMNS = [Col("message id"), Col("job", fold=FOLD), Col("subject", fold=FOLD, drop=2),
                Col("recipient", fold=FOLD), Col("deadline (UTC)", drop=1), Col("late")]


def overdue_holds(held: list[HeldMessage], jobs: list[Job], now: datetime) -> list[HeldMessage]:
    """The held messages of ``jobs`` nobody decided on by their deadline."""
    names = {job.name for job in jobs}
    return [h for h in held if h.job in names and h.message.hold_until is not None
            and h.message.hold_until <= now]


def _hold_row(h: HeldMessage, now: datetime) -> list[str | Text]:
    until = h.message.hold_until
    assert until is not None
    return [short_id(h.message.message_id), h.job, h.subject, h.message.recipient, utc(until),
            Text(duration(now - until), style="bold red")]


def duration(value: timedelta) -> str:
    """A lateness at a glance: ``45s``, ``12m``, ``5h 03m``, ``2d 04h``."""
    seconds = max(0, int(value.total_seconds()))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m" if minutes else f"{seconds}s"


@app.command("overdue", rich_help_panel=LOOK)
def overdue(
    job: str | None = typer.Option(None, "--job", help="Only this job (default: every job)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (times in UTC)."),
) -> None:
    """List what the jobs owe that is late, and why, and every unfinished Run.

    Why: never started, stranded, failed, still running past its due time, or skipped by the
    job's missed-run policy (listed, never counted as overdue). Due times are in each job's
    timezone. Then every unfinished Run of the jobs' versions, late or not: held (who holds its
    lease, until when), stranded (its lease ended), over-budget or pending, with a summary line
    such as "3 unfinished Runs: 1 held, 1 over-budget, 1 pending". Then the outbox messages
    held for approval past their deadline, counted as overdue. Reads only. --json prints
    {"late": [...], "unfinished": [...], "holds": [...]}.

    Exit status: 0 when nothing is overdue (owed and not completed nor skipped by its due
    time plus the job's grace) and no Run is unfinished, 1 when something is overdue or a Run
    is unfinished, 2 on an error; so it can gate a script."""
    with ledger_session(ERROR_EXIT) as ledger:
        jobs = [get_job(job)] if job else list(registered_jobs().values())
        found: list[Late] = []
        for one in jobs:
            planned = prepare(ledger, one, dry_run=True)
            found += late_steps(one, planned.steps, planned.now)
        now = ledger.now()
        unfinished = of_jobs(ledger, jobs, now)
        holds = overdue_holds(ledger.outbox.held(job=job), jobs, now)
    count = sum(1 for late in found if late.step.overdue) + len(holds)
    if as_json:
        print_json({"late": [late.as_dict() for late in found],
                    "unfinished": [fields(run) for run in unfinished],
                    "holds": [{"message_id": h.message.message_id, "job": h.job,
                               "subject": h.subject, "recipient": h.message.recipient,
                               "hold_until": utc(h.message.hold_until)} for h in holds]})
    else:
        out = console()
        if found:
            print_table(out, COLUMNS, [late.row() for late in found])
            skipped = sum(1 for late in found if late.step.state == "skipped")
            within = len(found) - count - skipped
            parts = [f"{count} overdue", f"{skipped} skipped by policy"]
            if within:
                parts.append(f"{within} late within their grace")
            out.print(", ".join(parts))
        else:
            out.print("nothing owed is late")
        print_unfinished(out, unfinished)
        if holds:
            print_table(out, HOLD_COLUMNS, [_hold_row(h, now) for h in holds],
                        title=f"{len(holds)} held message(s) past their approval deadline "
                              "(`runledger outbox approve` or `reject`)")
    if count or unfinished:
        raise typer.Exit(1)
