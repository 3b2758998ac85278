"""What the stages of one tick share: the tick itself, a claimed subject's hold on its Run, and
the Run the persist stage completed."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from flows.jobs import Job
from flows.jobs.budget import Estimator
from flows.model import BatchQueue, CallCount, EndpointLimiter, ModelClient
from flows.model.batch.protocol import BatchClient
from flows.prices import PriceList
from flows.run_job.lease_keeper import LeaseKeeper
from flows.run_job.outcomes import EventBacklog, SubjectOutcome, emit_outcome
from flows.run_job.stop import Stop, stopped_before
from flows.settings import RunledgerSettings
from store import Claim, Effect, Ledger, OutboxMessage, Period, Run, revised_target


@dataclass(frozen=True)
class Revising:
    """What a revise flow run changes in the stages it shares with a tick: the revision
    number, and whether its messages are queued again (with "revised" in their subject, and an
    object's key marked with the revision: the first report is never overwritten)."""

    number: int
    resend: bool = True

    def message(self, message: OutboxMessage) -> OutboxMessage:
        return replace(message, subject=f"{message.subject} (revised, revision {self.number})",
                       recipient=revised_target(message.channel, message.recipient, self.number))


@dataclass(frozen=True)
class Tick:
    """Everything the stages of one flow run share (a tick of a job, or the revision of one
    of its Runs)."""

    job: Job
    period: Period
    ledger: Ledger
    model: ModelClient
    prices: PriceList
    estimator: Estimator | None  # the job's budget, if it has one
    settings: RunledgerSettings
    flow_run_id: str
    stop: Stop = field(default_factory=Stop)
    revising: Revising | None = None
    events: EventBacklog = field(default_factory=EventBacklog)
    limiter: EndpointLimiter | None = None  # None: nothing limits the endpoint (offline)
    endpoint_concurrency: int | None = None  # the endpoint's max concurrent, if it has one
    batch: BatchQueue | None = None  # a batch tick: calls queued for the provider's Batch API
    batch_client: BatchClient | None = None  # ...and the client that submits them

    def messages(self, subject: str, output: dict[str, Any]) -> list[OutboxMessage]:
        """The outbox rows of a completion: the job's messages; a revision's are marked revised,
        or none without resend (their keys are the revision's own: its run id differs); held
        for a person when the job asks for approval (a revision's too)."""
        made = list(self.job.messages(subject, self.period, output))
        if self.revising is not None:
            made = [self.revising.message(m) for m in made] if self.revising.resend else []
        approval = self.job.approval_now()
        if approval is None:
            return made
        return approval.hold(made, timedelta(hours=self.settings.approval_deadline_hours))

    def effect(self) -> Effect | None:
        """The job's business effect of a completion; never a revision's (the flow refuses to
        revise a job with an effect: it would apply twice)."""
        if self.revising is not None:
            return None
        return self.job.effect

    @property
    def subject_concurrency(self) -> int:
        """Subjects run at once: RUNLEDGER_SUBJECT_CONCURRENCY when set, else as many as the
        endpoint allows in flight, else the setting's default."""
        if "subject_concurrency" in self.settings.model_fields_set \
                or self.endpoint_concurrency is None:
            return self.settings.subject_concurrency
        return self.endpoint_concurrency

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
