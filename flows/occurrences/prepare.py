"""A job's plan as the ledger stands: the one read that both a reconcile pass and the status
board start from (the board writes nothing; a pass also records the subjects first seen)."""

from __future__ import annotations

from datetime import datetime, timedelta

from flows.jobs import Job
from flows.occurrences.plan import (
    DEFAULT_CAP,
    Plan,
    asked_for,
    first_owed,
    owed_occurrences,
    plan,
    window_start,
)
from store import Ledger


def prepare(ledger: Ledger, job: Job, now: datetime | None = None, *, dry_run: bool = False,
            cap: int = DEFAULT_CAP, backoff: timedelta = timedelta(minutes=1),
            max_backoff: timedelta = timedelta(hours=1), since: datetime | None = None) -> Plan:
    """The job's plan at ``now`` (default: the database clock) over the periods from the one
    starting at ``since`` (default: the catch-up window's start); records, unless ``dry_run``,
    the period each subject seen for the first time is owed from."""
    now = ledger.now() if now is None else now
    since = window_start(job, now) if since is None else since
    runs = {r.run_id: r for r in ledger.occurrences.run_states(job.name, since)}
    known = ledger.occurrences.obligations(job.name)
    first_run: dict[str, datetime] = {}
    for run in runs.values():
        if run.version == job.version and run.subject not in known:
            first_run[run.subject] = min(run.period_start, first_run.get(run.subject, now))
    new = {s: first_owed(job, now, known, first_run.get(s))
           for s in job.subject_names() if s not in known}
    owed_from = ledger.occurrences.owe(job.name, new) if new and not dry_run else {**new, **known}
    owed = owed_occurrences(job, owed_from, now, since)
    owed = sorted([*owed, *asked_for(job, owed, runs, now)], key=lambda o: o.period.start)
    occurrences = {o.run_id: o for o in ledger.occurrences.list(job.name, since)}
    return plan(job, owed, runs, occurrences, now, cap=cap, backoff=backoff,
                max_backoff=max_backoff)
