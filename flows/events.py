"""Prefect events that name a Run, an owed occurrence or a job: the resources they name, the
events reconcile sends about its decisions (each under an id derived from the decision, so a
repeat is the same event) and the events about a job as a whole."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from prefect.client.orchestration import get_client
from prefect.events import Event, emit_event

from flows.jobs import Job
from flows.occurrences.plan import Step
from store import Ledger, Occurrence, Period, unemitted


def run_resource(job: str, version: str, subject: str, period: Period,
                 run_id: str) -> dict[str, str]:
    """The resource a Run's events name: its id and where it belongs."""
    return {
        "prefect.resource.id": f"runledger.run.{run_id}",
        "prefect.resource.name": f"{job}/{subject}/{period.label}",
        "runledger.job": job,
        "runledger.subject": subject,
        "runledger.version": version,
        "runledger.period": period.label,
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
    # Once per budget window, by the worker whose call first found it without room.
    "budget.exhausted": "runledger.budget.exhausted",
    # Each answer a provider billed beyond the bound its call reserved.
    "budget.overrun": "runledger.budget.overrun",
    # A batch tick's batch created at its provider, and settled by a poll.
    "batch.submitted": "runledger.batch.submitted",
    "batch.settled": "runledger.batch.settled",
}


log = logging.getLogger("runledger.reconcile")


def _occurrence_fields(kind: str, job: Job, subject: str, period: Period,
                       run_id: str) -> dict[str, Any]:
    """An occurrence event's name and resources: its Run's resource id even when no Run exists
    yet, and its job."""
    return {"event": OCCURRENCE_EVENTS[kind],
            "resource": run_resource(job.name, job.version, subject, period, run_id),
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
    claimed = ledger.occurrences.claim_events(job.name, EMIT_LEASE_SECONDS)
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
    ledger.occurrences.mark_emitted(claimed)


def _job_resource(job: Job) -> dict[str, str]:
    return {"prefect.resource.id": f"runledger.job.{job.name}", "prefect.resource.role": "job",
            "prefect.resource.name": job.name}


def emit_job_event(kind: str, job: Job, **payload: Any) -> None:
    """A Prefect event about a job as a whole (``runledger.job.<name>`` is its resource)."""
    resource = {**_job_resource(job), "runledger.job": job.name, "runledger.version": job.version}
    resource.pop("prefect.resource.role")
    emit_event(event=JOB_EVENTS[kind], resource=resource, payload=payload)
