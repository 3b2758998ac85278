"""What a backfill runs, period by period, oldest first: computed from the range's Runs and
skips (``plan``, no I/O) after two queries (``read_plan``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flows.backfill.request import Request
from flows.jobs import Job
from store import Ledger, Occurrence, Period, RunState


@dataclass(frozen=True)
class PeriodPlan:
    """One period of a backfill: the subjects its subflow runs, and those it leaves alone."""

    period: Period
    run: list[str]
    completed: list[str]
    failed: list[str]
    skipped: list[str]
    run_ids: dict[str, str]
    requeue: list[str] = field(default_factory=list)  # failed Runs to requeue before the run
    unskip: list[str] = field(default_factory=list)   # skips to clear before the run

    def row(self) -> dict[str, Any]:
        return {"period": self.period.label, "run": self.run, "completed": self.completed,
                "failed": self.failed, "skipped": self.skipped, "requeue": len(self.requeue),
                "unskip": len(self.unskip)}


@dataclass(frozen=True)
class Plan:
    """What a backfill runs, period by period, oldest first."""

    request: Request
    periods: list[PeriodPlan]

    @property
    def job(self) -> Job:
        return self.request.job

    @property
    def total(self) -> int:
        """Every (period, subject) of the backfill."""
        return len(self.periods) * len(self.request.subjects)

    @property
    def label(self) -> str:
        periods = self.request.periods
        return f"{self.job.name} {periods[0].label}..{periods[-1].label}"

    def summary(self) -> str:
        runs = sum(len(p.run) for p in self.periods)
        parts = [f"{runs} to run"]
        for name in ("completed", "failed", "skipped"):
            count = sum(len(getattr(p, name)) for p in self.periods)
            if count:
                parts.append(f"{count} {name}")
        requeue = sum(len(p.requeue) for p in self.periods)
        unskip = sum(len(p.unskip) for p in self.periods)
        if requeue:
            parts.append(f"{requeue} failed requeued first")
        if unskip:
            parts.append(f"{unskip} skips cleared first")
        return (f"backfill {self.label} ({len(self.periods)} periods x "
                f"{len(self.request.subjects)} subjects): {', '.join(parts)}")


def plan(request: Request, runs: Mapping[str, RunState],
         occurrences: Mapping[str, Occurrence]) -> Plan:
    """Where each (period, subject) stands and whether the backfill runs it: a completed Run
    never; a failed Run only with reprocess=failed (requeued first); an occurrence skipped by
    policy (and never run) only with reprocess=skipped (its skip cleared first); any other
    (no Run, or one pending or running) always, and run-job decides who finishes it."""
    job = request.job
    planned: list[PeriodPlan] = []
    for period in request.periods:
        run_ids = {s: job.identity(s, period).run_id for s in request.subjects}
        to_run: list[str] = []
        completed: list[str] = []
        failed: list[str] = []
        skipped: list[str] = []
        requeue: list[str] = []
        unskip: list[str] = []
        for subject, run_id in run_ids.items():
            run = runs.get(run_id)
            occurrence = occurrences.get(run_id)
            if run is not None and run.status == "completed":
                completed.append(subject)
            elif run is not None and run.status == "failed":
                if request.reprocess == "failed":
                    requeue.append(run_id)
                    to_run.append(subject)
                else:
                    failed.append(subject)
            elif run is None and occurrence is not None and occurrence.skipped_at is not None:
                if request.reprocess == "skipped":
                    unskip.append(run_id)
                    to_run.append(subject)
                else:
                    skipped.append(subject)
            else:
                to_run.append(subject)
        planned.append(PeriodPlan(period, to_run, completed, failed, skipped, run_ids,
                                  requeue, unskip))
    return Plan(request, planned)


def read_plan(ledger: Ledger, request: Request) -> Plan:
    """The plan from the range's Runs and recorded occurrences (two queries, from the first
    period on; only those of the range's identities count)."""
    since = request.periods[0].start
    wanted = {run_id for period in request.periods for run_id in
              (request.job.identity(s, period).run_id for s in request.subjects)}
    runs = {r.run_id: r for r in ledger.occurrences.run_states(request.job.name, since)
            if r.run_id in wanted}
    occurrences = {o.run_id: o for o in ledger.occurrences.list(request.job.name, since)
                   if o.run_id in wanted}
    return plan(request, runs, occurrences)
