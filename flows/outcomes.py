"""What happened to each subject of a tick, as people read it: Prefect state names, events,
the per-flow-run artifact and the flow run's final state."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from prefect import State
from prefect.events import emit_event
from prefect.states import Cancelled, Completed, Failed

from store import Period

# "stopped": the flow run was cancelled or timed out before the subject's next stage and its Run
# was released; an event of its own, so that alerts on failures do not fire for a cancel.
Outcome = Literal["new", "duplicate", "in-progress-elsewhere", "lease-lost", "stopped", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("new", "duplicate", "in-progress-elsewhere", "lease-lost",
                                 "stopped", "failed")
EVENTS: dict[Outcome, str] = {
    "new": "runledger.run.completed",
    "duplicate": "runledger.run.duplicate",
    "in-progress-elsewhere": "runledger.run.in-progress-elsewhere",
    "lease-lost": "runledger.run.lease-lost",
    "stopped": "runledger.run.stopped",
    "failed": "runledger.run.failed",
}
# The outcomes that name a tick's flow run when any subject has them, strongest first.
DECIDING: tuple[Outcome, ...] = ("failed", "stopped", "lease-lost", "in-progress-elsewhere")
STATE_NAMES: dict[Outcome, str] = {
    "new": "Completed",
    "duplicate": "Duplicate",
    "in-progress-elsewhere": "InProgressElsewhere",
    "lease-lost": "LeaseLost",
    "stopped": "Cancelled",
    "failed": "Failed",
}


@dataclass(frozen=True)
class SubjectOutcome:
    """One subject's result in one tick: its Run, what happened, and what was queued."""

    subject: str
    run_id: str
    outcome: Outcome
    attempts: int = 0
    outbox_rows: int = 0
    error: str | None = None
    output: dict[str, Any] | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TickReport:
    """Every subject's outcome for one job and period.

    A plain class, not a dataclass: Prefect walks whatever a flow returns (dataclasses field
    by field, every list and dict) looking for futures to resolve, and a report holds every
    subject's output; it leaves other objects alone."""

    __slots__ = ("job", "period", "subjects", "version")

    def __init__(self, job: str, version: str, period: Period,
                 subjects: list[SubjectOutcome]) -> None:
        self.job = job
        self.version = version
        self.period = period
        self.subjects = subjects

    def __repr__(self) -> str:
        return f"TickReport({self.summary()!r})"

    @property
    def name(self) -> str:
        return f"{self.job}/{self.period.label}"

    def counts(self) -> Counter[Outcome]:
        return Counter(s.outcome for s in self.subjects)

    def summary(self) -> str:
        counts = self.counts()
        parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts[o]]
        return f"{self.name}: {', '.join(parts) or 'no subjects'}"

    def deciding_outcome(self) -> Outcome:
        """Failed beats everything; then a stop; then the outcome that says the tick is not ours
        to finish; Duplicate only when every subject was already completed."""
        counts = self.counts()
        for outcome in DECIDING:
            if counts[outcome]:
                return outcome
        if self.subjects and counts["duplicate"] == len(self.subjects):
            return "duplicate"
        return "new"

    def state_name(self) -> str:
        return STATE_NAMES[self.deciding_outcome()]

    def final_state(self) -> State[Any]:
        """The flow run's state; its message names the subjects behind it (up to five) and
        why: the error, or who holds the lease and until when."""
        outcome = self.deciding_outcome()
        message = self.summary()
        if outcome in DECIDING:
            behind = [s for s in self.subjects if s.outcome == outcome and s.error]
            if behind:
                message += f" ({'; '.join(f'{s.subject}: {s.error}' for s in behind[:5])})"
        if outcome == "failed":
            return Failed(message=message, data=self)
        if outcome == "stopped":
            return Cancelled(message=message, data=self)
        return Completed(name=STATE_NAMES[outcome], message=message, data=self)

    def markdown(self) -> str:
        lines = [
            f"# {self.name}",
            "",
            f"Job `{self.job}` version `{self.version}`, period "
            f"`{self.period.start.isoformat()}` to `{self.period.end.isoformat()}` "
            f"({self.period.timezone}).",
            "",
            f"**{self.summary()}**",
            "",
            "| subject | Run id | outcome | attempts | outbox rows queued | error |",
            "|---|---|---|---|---|---|",
        ]
        for s in self.subjects:
            error = (s.error or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {s.subject} | `{s.run_id}` | {s.outcome} | {s.attempts} | "
                         f"{s.outbox_rows} | {error} |")
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job, "version": self.version, "period": self.period.label,
            "period_start": self.period.start.isoformat(),
            "period_end": self.period.end.isoformat(), "state": self.state_name(),
            "summary": self.summary(), "subjects": [s.as_dict() for s in self.subjects],
        }


def emit_outcome(job: str, version: str, period: Period, outcome: SubjectOutcome) -> None:
    """A Prefect event for a ledger transition (or a refusal), with the Run as the resource."""
    emit_event(
        event=EVENTS[outcome.outcome],
        resource={
            "prefect.resource.id": f"runledger.run.{outcome.run_id}",
            "prefect.resource.name": f"{job}/{outcome.subject}/{period.label}",
            "runledger.job": job,
            "runledger.subject": outcome.subject,
            "runledger.version": version,
            "runledger.period": period.label,
        },
        payload={"attempts": outcome.attempts, "outbox_rows": outcome.outbox_rows,
                 "error": outcome.error},
    )
