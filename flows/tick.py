"""What the stages of one tick share: the tick itself, a claimed subject's hold on its Run, and
the Run the persist stage completed."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from typing import Any

from flows.jobs import Job
from flows.lease_keeper import LeaseKeeper
from flows.model import CallCount, CallLog, Model
from flows.outcomes import EventBacklog, SubjectOutcome, emit_outcome
from flows.settings import RunledgerSettings
from flows.stop import Stop, stopped_before
from store import Claim, Effect, Ledger, OutboxMessage, Period, Run


@dataclass(frozen=True)
class Revising:
    """What a revise flow run changes in the stages it shares with a tick: the revision
    number, and whether its messages are queued again (with "revised" in their subject)."""

    number: int
    resend: bool = True

    def message(self, message: OutboxMessage) -> OutboxMessage:
        return replace(message, subject=f"{message.subject} (revised, revision {self.number})")


@dataclass(frozen=True)
class Tick:
    """Everything the stages of one flow run share (a tick of a job, or the revision of one
    of its Runs)."""

    job: Job
    period: Period
    ledger: Ledger
    model: Model
    call_log: CallLog | None
    settings: RunledgerSettings
    flow_run_id: str
    stop: Stop = field(default_factory=Stop)
    revising: Revising | None = None
    events: EventBacklog = field(default_factory=EventBacklog)

    def messages(self, subject: str, output: dict[str, Any]) -> list[OutboxMessage]:
        """The outbox rows of a completion: the job's messages; a revision's are marked revised,
        or none without resend (their keys are the revision's own: its run id differs)."""
        made = list(self.job.messages(subject, self.period, output))
        if self.revising is None:
            return made
        return [self.revising.message(m) for m in made] if self.revising.resend else []

    def effect(self, output: dict[str, Any]) -> Effect | None:
        """The job's business effect of a completion; never a revision's (the flow refuses to
        revise a job with an effect: it would apply twice)."""
        effect = self.job.effect
        if effect is None or self.revising is not None:
            return None
        return lambda session: effect(session, output)

    @property
    def lease_seconds(self) -> float:
        return self.settings.lease_seconds or self.job.lease_seconds

    def owner(self, task_run_id: str) -> str:
        """A unique owner per attempt: owner equality lets a claim be taken again."""
        return f"{socket.gethostname()}:{os.getpid()}:{self.flow_run_id}/{task_run_id}"

    def check_running(self, stage: str) -> None:
        """Raise FlowRunStopped if the flow run stopped before ``stage``."""
        if self.stop.is_set():
            raise stopped_before(stage)

    def emit(self, outcome: SubjectOutcome) -> SubjectOutcome:
        emit_outcome(self.job.name, self.job.version, self.period, outcome)
        return outcome


@dataclass(frozen=True)
class Held:
    """A claimed subject's hold on its Run, which every stage of that subject presents: the
    tick, the claim, the keeper renewing its lease and the model calls made under it."""

    tick: Tick
    claim: Claim
    keeper: LeaseKeeper
    calls: CallCount = field(default_factory=CallCount)


class Persisted:
    """The Run this attempt completed, and how many outbox rows it queued.

    A plain class, not a dataclass: Prefect walks a task's return value (dataclasses and
    pydantic models field by field) looking for futures, and the Run carries its raw input
    and output; it leaves other objects alone."""

    __slots__ = ("outbox_rows", "run")

    def __init__(self, run: Run, outbox_rows: int) -> None:
        self.run = run
        self.outbox_rows = outbox_rows
