"""What happened to each subject of a tick, as people read it: Prefect state names, events,
the per-flow-run artifact and the flow run's final state."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from prefect import State
from prefect.client.orchestration import get_client
from prefect.events import Event, emit_event
from prefect.events.worker import EventsWorker, should_emit_events
from prefect.states import Cancelled, Completed, Failed

from flows.stop import Stop
from store import Ledger, Occurrence, OutputPruned, Period, unemitted

if TYPE_CHECKING:
    from flows.jobs import Job
    from flows.reconcile.plan import Step

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
    # A duplicate whose Run is a tombstone: when its output was pruned, and its digest.
    pruned: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def require_output(self) -> dict[str, Any]:
        """The Run's output, for a caller that needs it; ``OutputPruned`` when retention
        pruned it (nothing is recomputed), ``LookupError`` when the subject has none."""
        if self.pruned is not None:
            raise OutputPruned(f"run {self.run_id} ({self.subject}) is completed but its output "
                               f"was pruned: {self.pruned}; nothing was recomputed. Request a "
                               "revision to compute it anew")
        if self.output is None:
            raise LookupError(f"run {self.run_id} ({self.subject}) has no output: "
                              f"{self.outcome}{f' ({self.error})' if self.error else ''}")
        return self.output


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
        pruned = [s for s in self.subjects if s.pruned]
        if pruned:  # a rerun that finds tombstones says so, instead of recomputing
            message += (f" (output pruned, not recomputed: "
                        f"{'; '.join(f'{s.subject}: {s.pruned}' for s in pruned[:5])})")
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
            error = (s.error or (f"output pruned: {s.pruned}" if s.pruned else "")
                     ).replace("|", "\\|").replace("\n", " ")
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


log = logging.getLogger("runledger.reconcile")


def _occurrence_fields(kind: str, job: Job, subject: str, period: Period,
                       run_id: str) -> dict[str, Any]:
    """An occurrence event's name and resources: its Run's resource id even when no Run exists
    yet, and its job."""
    return {"event": OCCURRENCE_EVENTS[kind],
            "resource": _run_resource(job.name, job.version, subject, period, run_id),
            "related": [_job_resource(job)]}


def emit_occurrence_event(kind: str, job: Job, *, subject: str, period: Period, run_id: str,
                          **payload: Any) -> None:
    """A Prefect event about one owed occurrence, sent in the background."""
    emit_event(**_occurrence_fields(kind, job, subject, period, run_id), payload=payload)


# Seconds a pass holds the decisions it emits before another pass may emit them (the lease
# of a pass that died before recording them emitted).
EMIT_LEASE_SECONDS = 60.0
_EVENT_IDS = uuid.UUID("5d0c51b6-31c5-4b8e-9f3c-6e0f8d9a7c21")  # this project's uuid5 namespace


def decision_event_id(kind: str, run_id: str, decided_at: datetime) -> uuid.UUID:
    """The id of the event of one decision: emitted again, it is the same event, which the
    Prefect server stores once (the id is its key) and its triggers skip (an id seen in the
    last 30 minutes)."""
    return uuid.uuid5(_EVENT_IDS, f"{OCCURRENCE_EVENTS[kind]}/{run_id}/{decided_at.isoformat()}")


def _decision_payload(kind: str, job: Job, occurrence: Occurrence, period: Period,
                      step: Step | None) -> dict[str, Any]:
    """What the event says; ``step`` (this pass's plan of the occurrence, if any) adds where
    it stands and why."""
    if kind == "skipped":
        return {"reason": occurrence.skip_reason}
    if kind == "overdue":
        where = {"state": step.state, "reason": step.reason} if step else {}
        return {**where, "due_at": job.due_at(period).isoformat()}
    if kind == "recovered" or step is None:
        return {}
    run = step.run
    return {"reason": step.reason, "attempts": run.attempts if run else None,
            "error": run.error if run else None}


def emit_decisions(ledger: Ledger, job: Job, steps: Mapping[str, Step]) -> None:
    """Emit the events of the job's decisions not known to be emitted (this pass's, and any a
    killed pass left), each under its decision's own id, then record them emitted. ``steps``:
    this pass's plan, by run id (none for a stale tick)."""
    claimed = ledger.claim_events(job.name, EMIT_LEASE_SECONDS)
    if not claimed:
        return
    events = []
    for occurrence in claimed:
        period = job.period_at(occurrence.period_start)
        for kind, decided_at in unemitted(occurrence):
            events.append(Event(
                **_occurrence_fields(kind, job, occurrence.subject, period, occurrence.run_id),
                payload=_decision_payload(kind, job, occurrence, period,
                                          steps.get(occurrence.run_id)),
                id=decision_event_id(kind, occurrence.run_id, decided_at)))
    try:
        # Posted, not queued like emit_event's: the server's 204 says it has them (a queued
        # event that failed to send would only be logged by Prefect's events worker).
        with get_client(sync_client=True) as client:
            client.request("POST", "/events", json=[e.model_dump(mode="json") for e in events]
                           ).raise_for_status()
    except Exception:  # the Prefect API is down: a later pass emits them, after the lease
        log.warning("could not emit %d decision events of %s; a later pass will", len(events),
                    job.name, exc_info=True)
        return
    ledger.mark_emitted(claimed)


def _job_resource(job: Job) -> dict[str, str]:
    return {"prefect.resource.id": f"runledger.job.{job.name}", "prefect.resource.role": "job",
            "prefect.resource.name": job.name}


def emit_job_event(kind: str, job: Job, **payload: Any) -> None:
    """A Prefect event about a job as a whole (``runledger.job.<name>`` is its resource)."""
    resource = {**_job_resource(job), "runledger.job": job.name, "runledger.version": job.version}
    resource.pop("prefect.resource.role")
    emit_event(event=JOB_EVENTS[kind], resource=resource, payload=payload)


pipeline_log = logging.getLogger("runledger.pipeline")
# Events this process may hold unsent before a tick starts its next subject: about 100 subjects'
# (each subject's task runs send nine state events, and its outcome one).
EVENT_BACKLOG_LIMIT = 1_000
EVENT_STALL_SECONDS = 30.0  # sending nothing that long, Prefect's events worker is not waited for
_POLL_SECONDS = 0.05


def unsent_events() -> int:
    """How many events this process's Prefect events worker holds unsent (0 when events are
    off). Prefect's queue of them is unbounded, and each keeps the context it was emitted in
    (its task run's, with the task's parameters) until sent."""
    if not should_emit_events():
        return 0
    return EventsWorker.instance()._queue.qsize()  # no public accessor


class EventBacklog:
    """Holds a tick's next subject back while more than ``limit`` events wait to be sent and
    they are being sent: a tick makes events faster than a busy Prefect server takes them, and
    without this its process would hold every subject's events (and their task runs' contexts)
    at once, hundreds of megabytes at 10,000 subjects, and send them after the flow run ended.
    While nothing was sent for ``stall_seconds`` (the server away), the tick does not wait."""

    def __init__(self, limit: int | None = None, stall_seconds: float = EVENT_STALL_SECONDS,
                 unsent: Callable[[], int] = unsent_events) -> None:
        self.limit = EVENT_BACKLOG_LIMIT if limit is None else limit
        self.stall_seconds = stall_seconds
        self.unsent = unsent
        self.waited = 0.0  # seconds subjects spent waiting, all threads together
        self._sent_at = time.monotonic()  # when a waiter last saw the backlog shrink
        self._last = 0  # the last count of unsent events a waiter saw
        self._warned = False
        self._lock = threading.Lock()

    def stalled(self) -> bool:
        return time.monotonic() - self._sent_at > self.stall_seconds

    def _seen(self, unsent: int) -> None:
        """Record a count of unsent events; a smaller one than the last means events went."""
        with self._lock:
            if unsent < self._last or unsent <= self.limit:
                self._sent_at = time.monotonic()
            self._last = unsent

    def wait(self, stop: Stop) -> None:
        """Return once at most ``limit`` events wait, the worker stalled, or ``stop`` is set."""
        self._seen(unsent := self.unsent())
        if unsent <= self.limit:
            return
        began = time.monotonic()
        while unsent > self.limit and not self.stalled() and not stop.is_set():
            time.sleep(_POLL_SECONDS)
            self._seen(unsent := self.unsent())
        with self._lock:
            self.waited += time.monotonic() - began
            warn = unsent > self.limit and self.stalled() and not self._warned
            self._warned = self._warned or warn
        if warn:
            pipeline_log.warning(
                "Prefect's events worker sent none of its %d unsent events for %.0f s; the "
                "tick goes on without waiting for it until it sends again", unsent,
                self.stall_seconds)


def emit_outcome(job: str, version: str, period: Period, outcome: SubjectOutcome) -> None:
    """A Prefect event for a ledger transition (or a refusal), with the Run as the resource."""
    emit_event(
        event=EVENTS[outcome.outcome],
        resource=_run_resource(job, version, outcome.subject, period, outcome.run_id),
        payload={"attempts": outcome.attempts, "outbox_rows": outcome.outbox_rows,
                 "error": outcome.error,
                 **({"output_pruned": outcome.pruned} if outcome.pruned else {})},
    )
