"""The ``revise`` flow: a new output for a completed Run on purpose, as its next revision (a new
Run row of the same identity), through the same collect, transform, validate and persist stages
as a tick, with its own lease, fence and attempts.

The request is idempotent per flow run: a retry of the same revise flow run finds the revision
it asked for (``requested_by`` is the flow run id) and resumes it, or ends as ``Duplicate`` once
it completed. Given the id of an unfinished revision, the flow resumes that revision (a worker
died under it) instead of asking for another. At most one revision per Run is unfinished: the
ledger refuses a second with ``RevisionInProgress``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prefect import State, flow, get_run_logger
from prefect.runtime import flow_run as current_flow_run
from prefect.states import Failed

from flows.errors import NotReady
from flows.jobs import Job
from flows.jobs.schedule import require_due
from flows.registry import get_job
from flows.run_job.findings import describe
from flows.run_job.flow import ledgered
from flows.run_job.lease_keeper import LeaseKeeper
from flows.run_job.outcomes import STATE_NAMES, Outcome, SubjectOutcome, outcome_state
from flows.run_job.preflight import NOT_READY_STATE, preflight
from flows.run_job.stop import Stop
from flows.run_job.subjects import process_subject
from flows.run_job.tasks import configured_stages
from flows.run_job.tick import Revising
from flows.settings import RunledgerSettings
from store import (
    Ledger,
    Period,
    RevisionRefused,
    Run,
    RunledgerError,
    params_fingerprint,
)


@flow(name="revise", flow_run_name="revise/{run_id}", persist_result=False, log_prints=False)
async def revise(run_id: str, reason: str, recollect: bool = False, resend: bool = True,
                 params: dict[str, Any] | None = None,
                 allow_not_due: bool = False) -> State[Any]:
    """Revise a completed Run: compute a new output as its next revision, a new Run row linked
    to it; the original and its deliveries stay as they are.

    Args:
        run_id: The Run to revise (any of its revisions' ids, or a unique prefix); the id of
            an unfinished revision resumes that revision (with its own reason and resend).
        reason: Why the output must be redone, e.g. "recipients changed"; kept on the revision.
        recollect: Collect the input again instead of reusing the stored raw input.
        resend: Queue the revision's messages (new idempotency keys, "revised" in the
            subject); false: queue none.
        params: The revision's parameters as a JSON object, e.g. {"recipients": [...]}: the
            explicit answer to a changed configuration (they must be what the job computes
            now); leave empty to keep the latest completed revision's.
        allow_not_due: Revise a period whose occurrence is not due yet (refused otherwise: a
            completed revision never changes either).
    """
    logger = get_run_logger()
    stop = Stop()
    try:
        report = await asyncio.to_thread(
            run_revision, run_id, reason, recollect, resend, params, RunledgerSettings(),
            str(current_flow_run.id), stop, allow_not_due=allow_not_due)
    except NotReady as exc:
        logger.error("%s", exc)
        return Failed(name=NOT_READY_STATE, message=str(exc))
    except BaseException:
        stop.set()  # cancelled or timed out: the thread starts no more stages
        raise
    logger.info(report.message)
    return report.final_state()


# A revise flow run's state name per outcome of its revision: a tick's, but "Revised" for new.
REVISION_STATE_NAMES: dict[Outcome, str] = {**STATE_NAMES, "new": "Revised"}


class RevisionReport:
    """What a revise flow run came to: the revision's Run, its outcome and a readable message.

    A plain class, not a dataclass: Prefect walks a flow's return value looking for futures."""

    __slots__ = ("message", "outcome", "run")

    def __init__(self, run: Run, outcome: Outcome, message: str) -> None:
        self.run = run
        self.outcome = outcome
        self.message = message

    def final_state(self) -> State[Any]:
        return outcome_state(self.outcome, REVISION_STATE_NAMES[self.outcome], self.message,
                             self)

    def as_dict(self) -> dict[str, Any]:
        r = self.run
        return {"outcome": self.outcome, "message": self.message, "run_id": r.run_id,
                "revision": r.revision, "revises_run_id": r.revises_run_id,
                "reason": r.revision_reason, "status": r.status, "attempts": r.attempts}


def check_revisable(job: Job, run: Run, params: dict[str, Any] | None) -> dict[str, Any]:
    """Refuse, before anything is written, a revision the job cannot make truthfully: of
    another version than the job's code, of a job with a business effect (it would apply
    twice), or with params other than those the job computes now (its messages come from
    them); return the revision's params (the job's current ones)."""
    if run.version != job.version:
        raise RevisionRefused(
            f"run {run.run_id} is of {job.name} version {run.version}, and this code is "
            f"version {job.version}: a revision runs the job's current code; revise it where "
            f"version {run.version} is deployed, or run the period again under the new version")
    if job.effect is not None:
        raise RevisionRefused(
            f"job {job.name} applies a business effect when a Run completes; a revision would "
            "apply it a second time, so its Runs are not revised: correct the business rows "
            "by hand, or bump the job's version to compute the period anew")
    period = _period(job, run)
    current = job.run_params(run.subject, period)
    if params is not None and params_fingerprint(params) != params_fingerprint(current):
        raise RevisionRefused(
            f"--params {params} are not what job {job.name} computes now for {run.subject} "
            f"{period.label} ({current}): the revision's messages come from the job's current "
            f"configuration, so its params must be those; pass --params '{_json(current)}'")
    return current


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True)


def _period(job: Job, run: Run) -> Period:
    return job.period_at(run.period_start)


def run_revision(run_id: str, reason: str, recollect: bool, resend: bool,
                 params: dict[str, Any] | None, settings: RunledgerSettings, flow_run_id: str,
                 stop: Stop, *, allow_not_due: bool = False) -> RevisionReport:
    """The revise flow's blocking part: check, request (or resume) the revision, claim it and
    take it through the stages."""
    with Ledger.open_existing() as ledger:
        target = ledger.get(ledger.resolve_run_id(run_id))
        job = get_job(target.job)
        require_due(job, _period(job, target), ledger.now(), allow_not_due=allow_not_due)
        params = check_revisable(job, target, params)
        preflight(job, settings, sends=resend)  # before the revision is requested
        if target.revision > 0 and target.status in ("pending", "running"):
            revision = target  # resume an unfinished revision, named by its own id
        else:
            revision = ledger.request_revision(
                target.run_id, reason, params=params, recollect=recollect, resend=resend,
                requested_by=flow_run_id).run
    return _drive(job, revision, settings, flow_run_id, stop)


def _drive(job: Job, revision: Run, settings: RunledgerSettings, flow_run_id: str,
           stop: Stop) -> RevisionReport:
    what = (f"revision {revision.revision} of {job.name}/{revision.subject}/"
            f"{_period(job, revision).label} ({revision.revision_reason})")
    if revision.status == "completed":
        return RevisionReport(revision, "duplicate", f"{what} was completed already: "
                                                     f"run {revision.run_id}")
    if revision.status == "failed":
        return RevisionReport(revision, "failed", f"{what} failed ({revision.error}); ask for "
                                                  "a new revision once the cause is fixed")
    with ledgered(job, _period(job, revision), settings, flow_run_id, stop,
                  Revising(revision.revision, revision.resend is not False)) as tick:
        claim = tick.ledger.claim(revision.run_id, tick.owner("revise"), tick.lease_seconds)
        run = tick.ledger.get(revision.run_id)
        if claim is None:
            if run.status == "completed":
                return RevisionReport(run, "duplicate", f"{what} was completed already")
            until = run.lease_expires_at.isoformat(timespec="seconds") \
                if run.lease_expires_at else "?"
            return RevisionReport(run, "in-progress-elsewhere" if run.status == "running"
                                  else "failed",
                                  f"{what} is {run.status}, leased by {run.owner} until {until}")
        stages = configured_stages(settings.task_retries, settings.retry_delay_seconds)
        try:
            with LeaseKeeper(tick.ledger, tick.lease_seconds) as keeper:
                keeper.hold([claim])
                outcome = process_subject(tick, stages, keeper, run.subject, run, claim)
        except RunledgerError as exc:  # the ledger itself failed: the revision stays unfinished
            outcome = SubjectOutcome(run.subject, run.run_id, "failed", error=describe(exc))
        # The revision's Run is the event's resource: runledger.run.completed with its cost.
        tick.emit(outcome)
        run = tick.ledger.get(revision.run_id)
    return RevisionReport(run, outcome.outcome, _message(what, run, outcome))


def _message(what: str, run: Run, outcome: SubjectOutcome) -> str:
    if outcome.outcome == "new":
        rows = f"{outcome.outbox_rows} outbox rows" if outcome.outbox_rows else "nothing resent"
        return f"{what} completed: run {run.run_id}, {rows}"
    return (f"{what} {outcome.outcome}: {outcome.error}; resume it with `runledger runs revise "
            f"{run.run_id} --reason ...`" if run.status in ("pending", "running")
            else f"{what} {outcome.outcome}: {outcome.error}")
