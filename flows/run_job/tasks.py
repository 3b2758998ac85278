"""The stage tasks of a tick, as Prefect runs them: register+claim once per batch of subjects,
then collect, transform and persist once per claimed subject, each returning its value or a
named state (LeaseLost, OverBudget) that ``stages.stage_value`` reads; ``configured_stages`` gives
them a flow run's retry policy."""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from prefect import State, task
from prefect.runtime import task_run as current_task_run
from prefect.states import Completed
from prefect.tasks import Task

from flows.budgeting import OVER_BUDGET_STATE, overrun_payload
from flows.events import emit_job_event
from flows.jobs import Candidate, TransientError, ValidationFailed
from flows.model import CallBound, QueuedForBatch, RecordedModel
from flows.run_job.findings import FINDINGS, finding
from flows.run_job.stages import (
    AWAITING_BATCH_STATE,
    STAGE_OPTIONS,
    lease_lost_state,
    lost_state,
    with_retries,
)
from flows.run_job.tick import Held, Persisted, Tick
from flows.targets import check_targets
from store import BudgetExhausted, CompletedBy, LeaseLost, RunIdentity, Usage

log = logging.getLogger(__name__)


def _register_and_claim_name(parameters: dict[str, Any]) -> str:
    return f"register+claim[{len(parameters['identities'])} subjects]"


# Prefect calls a name callback with the parameters when it has a ``parameters`` argument; its
# Protocol for that also demands a classmethod no plain function has.
@task(name="register+claim", task_run_name=_register_and_claim_name,  # type: ignore[arg-type]
      **STAGE_OPTIONS)
def register_and_claim(tick: Tick, identities: dict[str, RunIdentity]) -> State[Any]:
    """Register every subject's Run of a batch (one row per identity) and take the leases
    nobody else holds, in one ledger call; returns each subject's Registration."""
    found = tick.ledger.register_and_claim_many(
        [(identity, tick.job.run_params(subject, tick.period))
         for subject, identity in identities.items()],
        owner=tick.owner(str(current_task_run.id)), lease=tick.lease_seconds,
    )
    registrations = {subject: found[identity.run_id] for subject, identity in identities.items()}
    counts = Counter(finding(r) for r in registrations.values())
    # A read-only view, not the dict: Prefect walks a returned dict (every Registration, every
    # Run's fields) looking for futures, and leaves a mapping of another type alone.
    return Completed(message=", ".join(f"{counts[f]} {f.replace('-', ' ')}" for f in FINDINGS),
                     data=MappingProxyType(registrations))


@task(name="collect", task_run_name="collect[{subject}]", **STAGE_OPTIONS)
def collect_input(subject: str, held: Held) -> State[Any] | dict[str, Any]:
    """Collect the raw input and store it once; the stored value (maybe an earlier one) wins."""
    if (lost := lost_state(held.keeper, held.claim)) is not None:
        return lost
    raw = held.tick.job.collect(subject, held.tick.period)
    try:
        return held.tick.ledger.save_input(held.claim, raw)
    except LeaseLost as exc:
        return lease_lost_state(exc)


@task(name="transform", task_run_name="transform[{subject}]", **STAGE_OPTIONS)
def transform_input(subject: str, held: Held, raw: dict[str, Any]) -> State[Any] | Candidate:
    """Ask the model for a candidate; a lease already lost skips the model call."""
    tick = held.tick
    if (lost := lost_state(held.keeper, held.claim)) is not None:
        return lost
    model = RecordedModel(tick.model, tick.ledger.calls, held.claim, tick.prices, held.calls,
                          budgeting=tick.estimator, limiter=tick.limiter,
                          refused_for_seconds=tick.settings.model_refused_for_seconds,
                          overran=functools.partial(_overran, tick, subject),
                          batch=tick.batch)
    try:
        candidate = tick.job.transform(raw, model)
    except QueuedForBatch as exc:
        # Not a failure, and not for Prefect to retry: the Run waits for its batch.
        return Completed(name=AWAITING_BATCH_STATE, message=str(exc), data=exc)
    except BudgetExhausted as exc:
        # Not a failure, and not for Prefect to retry: the Run waits for room in the budget.
        return Completed(name=OVER_BUDGET_STATE, message=str(exc), data=exc)
    except LeaseLost as exc:  # another attempt took the Run over during a model call
        return lease_lost_state(exc)
    except TransientError as exc:
        if exc.retry_after and (current_task_run.run_count or 1) <= tick.settings.task_retries:
            time.sleep(min(exc.retry_after, tick.settings.max_retry_after_seconds))
        raise
    if model.queued:  # a transform that caught QueuedForBatch still waits for its batch
        waiting = QueuedForBatch(f"a model call of run {held.claim.run_id} is queued for a "
                                 "batch (the transform went on without its answer, which is "
                                 "discarded)", None)
        return Completed(name=AWAITING_BATCH_STATE, message=str(waiting), data=waiting)
    return candidate


@task(name="persist", task_run_name="persist[{subject}]", **STAGE_OPTIONS)
def persist_output(subject: str, held: Held, candidate: Candidate) -> State[Any]:
    """Validate the candidate, then complete the Run with its outbox rows and business effect
    in one transaction; a moved fence discards the candidate."""
    tick, claim = held.tick, held.claim
    if (lost := lost_state(held.keeper, claim, "candidate discarded: ")) is not None:
        return lost
    try:
        tick.job.validate(candidate)
    except ValidationFailed:
        # The answers behind a rejected candidate stay as evidence, never to be replayed.
        tick.ledger.calls.reject_answers(claim)
        raise
    output = candidate.output()
    messages = tick.messages(subject, output)
    check_targets(messages)  # a missing webhook or bucket block: refused, nothing written
    try:
        done = tick.ledger.complete(
            claim, output, messages, tick.effect(),
            CompletedBy(held.calls.made, tick.flow_run_id, str(current_task_run.id)),
        )
    except LeaseLost as exc:
        return lease_lost_state(exc, "candidate discarded: ")
    # A retry after a lost reply finds the Run completed by this very attempt.
    if done.new or done.run.completed_attempt_id == claim.attempt_id:
        rows = len({(m.channel, m.recipient) for m in messages})
        return Completed(message=f"completed with {rows} outbox rows",
                         data=Persisted(done.run, rows))
    return lease_lost_state(LeaseLost(
        f"run {claim.run_id} was completed by another attempt; candidate discarded"))


@dataclass(frozen=True)
class Stages:
    """The stage tasks (register+claim once per batch, the others once per claimed subject),
    with a flow run's retry policy for transient failures."""

    claim: Task[..., Any]
    collect: Task[..., Any]
    transform: Task[..., Any]
    persist: Task[..., Any]


@functools.lru_cache(maxsize=16)
def configured_stages(retries: int, delay_seconds: float) -> Stages:
    # Copying four tasks with new options costs a few milliseconds: once per retry policy.
    return Stages(*(with_retries(t, retries, delay_seconds) for t in
                    (register_and_claim, collect_input, transform_input, persist_output)))


def _overran(tick: Tick, subject: str, call_id: str, bound: CallBound, usage: Usage) -> None:
    """A provider billed an answer beyond its call's bound (recorded on the call): said in the
    log and as an event, never hidden."""
    payload = overrun_payload(tick.limiter.name if tick.limiter else tick.model.endpoint,
                              tick.model.name, subject, call_id, bound, usage)
    log.warning("job %s, subject %s: model call %s was billed %s tokens beyond its bound (input "
                "%s, max_tokens %s): the provider did not honour max_tokens, and a budget may "
                "be passed by that much", tick.job.name, subject, call_id, usage.overrun,
                bound.input_tokens, bound.max_tokens)
    emit_job_event("budget.overrun", tick.job, **payload)
