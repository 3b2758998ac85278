"""What happened to each subject of a tick, as people read it: Prefect state names, events,
the per-flow-run artifact and the flow run's final state."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from prefect import State
from prefect.events import emit_event
from prefect.states import Cancelled, Completed, Failed

from store import Period

if TYPE_CHECKING:
    from flows.jobs import Job
    from flows.reconcile.plan import Owed

# "stopped": the flow run was cancelled or timed out before the subject's next stage and its Run
# was released; an event of its own, so that alerts on failures do not fire for a cancel.
# "skipped": a scheduled flow run that started later than the job allows, whose missed-run
# policy says not to run it (the occurrence is recorded skipped).
Outcome = Literal["new", "duplicate", "in-progress-elsewhere", "lease-lost", "stopped", "skipped",
                  "failed"]
OUTCOMES: tuple[Outcome, ...] = ("new", "duplicate", "in-progress-elsewhere", "lease-lost",
                                 "stopped", "skipped", "failed")
EVENTS: dict[Outcome, str] = {
    "new": "runledger.run.completed",
    "duplicate": "runledger.run.duplicate",
    "in-progress-elsewhere": "runledger.run.in-progress-elsewhere",
    "lease-lost": "runledger.run.lease-lost",
    "stopped": "runledger.run.stopped",
    "skipped": "runledger.run.skipped",
    "failed": "runledger.run.failed",
}
NO_SUBJECTS = "NoSubjects"
# The outcomes that name a tick's flow run when any subject has them, strongest first.
DECIDING: tuple[Outcome, ...] = ("failed", "stopped", "lease-lost", "in-progress-elsewhere",
                                 "skipped")
STATE_NAMES: dict[Outcome, str] = {
    "new": "Completed",
    "duplicate": "Duplicate",
    "in-progress-elsewhere": "InProgressElsewhere",
    "lease-lost": "LeaseLost",
    "stopped": "Cancelled",
    "skipped": "Skipped",
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
        return STATE_NAMES[self.deciding_outcome()] if self.subjects else NO_SUBJECTS

    def completed_every_subject(self) -> bool:
        """Every subject of the tick has a completed Run (new now, or before)."""
        return bool(self.subjects) and all(s.outcome in ("new", "duplicate")
                                           for s in self.subjects)

    def final_state(self) -> State[Any]:
        """The flow run's state; its message names the subjects behind it (up to five) and
        why: the error, or who holds the lease and until when."""
        outcome = self.deciding_outcome()
        message = self.summary()
        if not self.subjects:  # a job that lists nobody owes nothing: not a healthy tick
            return Completed(name=NO_SUBJECTS, data=self, message=(
                f"{self.name}: the job listed no subjects, so nothing ran; check where its "
                "subjects come from"))
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


# What reconcile reports about an owed occurrence, and about a job as a whole.
OCCURRENCE_EVENTS = {
    "skipped": "runledger.run.skipped",
    "overdue": "runledger.run.overdue",
    "recovered": "runledger.run.recovered",
    "gave-up": "runledger.run.gave-up",
}
JOB_EVENTS = {
    "tick.completed": "runledger.tick.completed",
    "reconcile.capped": "runledger.reconcile.capped",
}


def _run_resource(job: str, version: str, subject: str, period: Period,
                  run_id: str) -> dict[str, str]:
    return {
        "prefect.resource.id": f"runledger.run.{run_id}",
        "prefect.resource.name": f"{job}/{subject}/{period.label}",
        "runledger.job": job,
        "runledger.subject": subject,
        "runledger.version": version,
        "runledger.period": period.label,
    }


def emit_occurrence_event(kind: str, job: Job, owed: Owed | None = None, *, subject: str | None = None,
                          period: Period | None = None, run_id: str | None = None,
                          **payload: Any) -> None:
    """A Prefect event about one owed occurrence (``owed``, or its subject, period and run id),
    with its Run's resource id even when no Run exists yet."""
    if owed is not None:
        subject, period, run_id = owed.subject, owed.period, owed.identity.run_id
    assert subject is not None and period is not None and run_id is not None
    emit_event(event=OCCURRENCE_EVENTS[kind],
               resource=_run_resource(job.name, job.version, subject, period, run_id),
               related=[_job_resource(job)], payload=payload)


def _job_resource(job: Job) -> dict[str, str]:
    return {"prefect.resource.id": f"runledger.job.{job.name}", "prefect.resource.role": "job",
            "prefect.resource.name": job.name}


def emit_job_event(kind: str, job: Job, **payload: Any) -> None:
    """A Prefect event about a job as a whole (``runledger.job.<name>`` is its resource)."""
    resource = {**_job_resource(job), "runledger.job": job.name, "runledger.version": job.version}
    resource.pop("prefect.resource.role")
    emit_event(event=JOB_EVENTS[kind], resource=resource, payload=payload)


def emit_outcome(job: str, version: str, period: Period, outcome: SubjectOutcome) -> None:
    """A Prefect event for a ledger transition (or a refusal), with the Run as the resource."""
    emit_event(
        event=EVENTS[outcome.outcome],
        resource=_run_resource(job, version, outcome.subject, period, outcome.run_id),
        payload={"attempts": outcome.attempts, "outbox_rows": outcome.outbox_rows,
                 "error": outcome.error},
    )
