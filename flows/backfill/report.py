"""What came of a backfill: each period's result and the report the flow returns."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from prefect import State
from prefect.states import Completed, Failed

from flows.backfill.plan import PeriodPlan, Plan
from flows.run_job.outcomes import Outcome, TickReport, over_budget_state

# What each (subject, period) of a backfill came to: a run-job outcome, or, for those the plan
# left alone, "duplicate" (completed before), "failed" (failed before) or "skipped". Every
# Outcome, in the order the summary names them.
COUNTED: tuple[Outcome, ...] = ("new", "duplicate", "failed", "over-budget", "waiting", "skipped",
                                "stopped", "in-progress-elsewhere", "lease-lost")


@dataclass
class PeriodResult:
    """One period's plan and what its run-job subflow reported (none if nothing was run)."""

    planned: PeriodPlan
    tick: TickReport | None = None
    flow_run_id: str | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return self.planned.period.label

    def outcomes(self) -> dict[str, str]:
        """Each subject's outcome: the subflow's, or the plan's for those it left alone."""
        found: dict[str, str] = dict.fromkeys(self.planned.completed, "duplicate")
        found.update(dict.fromkeys(self.planned.failed, "failed"))
        found.update(dict.fromkeys(self.planned.skipped, "skipped"))
        if self.tick is not None:
            found.update({s.subject: s.outcome for s in self.tick.subjects})
        elif self.error is not None:
            found.update(dict.fromkeys(self.planned.run, "failed"))
        return found

    def counts(self) -> Counter[str]:
        return Counter(self.outcomes().values())

    def as_dict(self) -> dict[str, Any]:
        outcomes = self.outcomes()
        return {"period": self.label, "flow_run_id": self.flow_run_id, "error": self.error,
                "counts": dict(self.counts()),
                "subjects": [{"subject": s, "run_id": self.planned.run_ids[s],
                              "outcome": outcomes.get(s)} for s in self.planned.run_ids]}


class BackfillReport:
    """A backfill's plan and each period's result.

    A plain class, not a dataclass: Prefect walks whatever a flow returns (dataclasses field
    by field) looking for futures, and the ticks hold every subject's output."""

    __slots__ = ("dry_run", "plan", "results")

    def __init__(self, planned: Plan, results: list[PeriodResult] | None = None,
                 dry_run: bool = False) -> None:
        self.plan = planned
        self.results = results or []
        self.dry_run = dry_run

    def counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for result in self.results:
            total.update(result.counts())
        return total

    def failed(self) -> bool:
        return self.counts()["failed"] > 0

    def summary(self) -> str:
        if self.dry_run:
            return "dry run: " + self.plan.summary()
        counts = self.counts()
        parts = [f"{counts[c]} {c}" for c in COUNTED if counts[c]]
        done = len(self.results)
        ran = sum(1 for r in self.results if r.flow_run_id is not None)
        return (f"backfill {self.plan.label}: {done} of {len(self.plan.periods)} periods "
                f"({ran} run), {', '.join(parts) or 'nothing'}")

    def final_state(self) -> State[Any]:
        if self.failed():
            return Failed(message=self.summary(), data=self)
        if self.counts()["over-budget"]:
            # Its periods may be older than reconcile's catch-up window: the backfill itself,
            # run again, takes up every Run it left pending.
            return over_budget_state(
                f"{self.summary()}; the budget refused some Runs' model calls: raise the cap "
                "and run the same backfill again", self)
        return Completed(message=self.summary(), data=self)

    def as_dict(self) -> dict[str, Any]:
        request = self.plan.request
        return {"job": self.plan.job.name, "start": request.periods[0].label,
                "end": request.periods[-1].label, "subjects": request.subjects,
                "reprocess": request.reprocess, "dry_run": self.dry_run,
                "summary": self.summary(), "counts": dict(self.counts()),
                "plan": [p.row() for p in self.plan.periods],
                "periods": [r.as_dict() for r in self.results]}
