"""The ``run-job`` flow: one tick of a job, each subject's Run registered, claimed, collected,
transformed and persisted at most once, whatever retries, overlaps or reruns happen.

Per tick: one batched read; then, a batch of subjects not yet finished at a time, one
register+claim task run and one lease keeper for its claims; per claimed subject: collect,
transform, persist.

The ledger is the authority: Prefect's retries only repeat a stage, Prefect's caching is off,
and the nominal time comes from the flow run's expected start (or the ``period`` parameter),
never from a worker's clock.

This module reads top-down: the flow, its tick, the stage tasks, then the fan-out of claimed
subjects to threads. Beside it: ``tick`` (what the stages share), ``stages`` (a stage's Prefect
options and states), ``findings`` (ledger findings as outcomes), ``stop``, ``monitoring``."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from prefect import State, flow, get_run_logger, task
from prefect.context import FlowRunContext, SyncClientContext
from prefect.runtime import flow_run as current_flow_run
from prefect.runtime import task_run as current_task_run
from prefect.states import Completed
from prefect.tasks import Task
from prefect.utilities.annotations import quote

from flows.board import Board
from flows.findings import (
    FINDINGS,
    describe,
    finding,
    finished_outcome,
    lease_lost_outcome,
    unclaimed_outcome,
)
from flows.jobs import Candidate, Job, TransientError, get_job, is_transient
from flows.lease_keeper import LeaseKeeper
from flows.model import CallLog, LoggedModel, model_from_settings
from flows.monitoring import (
    after_tick,
    label_flow_run,
    publish_artifacts,
    tick_artifact_key,
    wait_for_tick_artifacts,
)
from flows.outcomes import Outcome, SubjectOutcome, TickReport, emit_job_event
from flows.settings import RunledgerSettings
from flows.stages import (
    STAGE_OPTIONS,
    lease_lost_state,
    lost_state,
    retried,
    stage_value,
    with_retries,
)
from flows.stale import skip_tick, stale_reason
from flows.stop import FlowRunStopped, Stop, stopped_before
from flows.tick import Held, Persisted, Revising, Tick
from store import (
    Claim,
    CompletedBy,
    LeaseLost,
    Ledger,
    Period,
    Registration,
    Run,
    RunIdentity,
    RunledgerError,
)


# Async so that a flow run ends as soon as its work does: Prefect's sync flow engine waits for
# its heartbeat thread, which sleeps in whole seconds, when the flow returns (up to 1 s per run).
# The flow names its flow run itself, not through ``flow_run_name=``: Prefect resolves that
# before the flow starts, through a client of its own (TLS set-up, two round trips).
@flow(name="run-job", persist_result=False, log_prints=False,
      on_completion=[wait_for_tick_artifacts], on_failure=[wait_for_tick_artifacts])
async def run_job(job: str, subjects: list[str] | None = None,
                  period: str | None = None) -> State[Any]:
    """Run one tick of a job: every subject's Run is completed once, retries and reruns of the
    same period return the stored output.

    Args:
        job: Name of a registered job, e.g. competitor-summary or daily-credit.
        subjects: Subjects to run, e.g. ["acme"]; leave empty for all of the job's subjects.
        period: Which period to run or redo. Either a date YYYY-MM-DD (a day in the job's
            timezone), or an ISO datetime with an offset such as 2026-11-29T09:00:00+01:00
            (the period containing it). Leave empty for the period of this flow run's
            scheduled time.
    """
    logger = get_run_logger()
    try:
        definition = get_job(job)
        the_period = nominal_period(definition, period)
        # Every identity is checked before anything is written.
        identities = {s: definition.identity(s, the_period)
                      for s in definition.resolve_subjects(subjects)}
    except RunledgerError:
        await label_flow_run(f"{job}/invalid-input", None)
        raise
    settings = RunledgerSettings()
    # Name and tags are monitoring: their API call need not hold up the tick.
    labelling = asyncio.create_task(
        label_flow_run(f"{definition.name}/{the_period.label}", definition))
    flow_run_id = str(current_flow_run.id)
    stop = Stop()
    try:
        report, board = await asyncio.to_thread(
            run_ledgered_tick, definition, the_period, identities, settings, flow_run_id, stop,
            None if period else scheduled_start())
    except BaseException:
        # Cancelled or timed out: the thread runs on (asyncio cannot stop it), but its subjects
        # start no more stages; asyncio.run waits for it before the process ends.
        stop.set()
        await asyncio.gather(labelling, return_exceptions=True)  # the tick's error is the news
        raise
    await labelling
    publish_artifacts(flow_run_id, tick_artifact_key(definition.name), report, board)
    if report.completed_every_subject() and len(identities) == len(definition.subject_names()):
        emit_job_event("tick.completed", definition, period=the_period.label)
    logger.info(report.summary())
    return report.final_state()


def nominal_period(job: Job, period: str | None) -> Period:
    """The explicit ``period`` if given, else the period containing the flow run's expected
    start time (the same on every retry of this flow run). A ``period`` that is not a string
    (the API accepts any JSON value) is refused by ``parse_period`` as InvalidPeriod."""
    if period is not None and (not isinstance(period, str) or period.strip()):
        return job.parse_period(period)
    return job.period_at(scheduled_start())


def scheduled_start() -> datetime:
    """This flow run's expected start: its slot for a scheduled run (kept across retries), its
    creation for one made by hand."""
    return datetime.fromtimestamp(current_flow_run.scheduled_start_time.timestamp(), UTC)


def run_ledgered_tick(job: Job, period: Period, identities: dict[str, RunIdentity],
                      settings: RunledgerSettings, flow_run_id: str,
                      stop: Stop, expected_start: datetime | None = None
                      ) -> tuple[TickReport, Board | None]:
    """The tick's blocking part, in a thread of its own: ledger, model and stage task runs,
    then the count of its Runs asked for again and the job's status board as the tick left it
    (None if it could not be read). A tick of
    no explicit period, expected at ``expected_start``, that starts too late may be skipped by
    its job's missed-run policy (``stale_reason``)."""
    with ledgered(job, period, settings, flow_run_id, stop) as tick:
        stale = (None if expected_start is None
                 else stale_reason(job, period, expected_start, tick.ledger.now()))
        report = (run_tick(tick, identities) if stale is None
                  else skip_tick(tick, identities, stale))
        return report, after_tick(tick.ledger, job, report)


@contextmanager
def ledgered(job: Job, period: Period, settings: RunledgerSettings, flow_run_id: str,
             stop: Stop, revising: Revising | None = None) -> Iterator[Tick]:
    """A Tick with its own ledger connection and model client, closed when it ends, inside one
    sync Prefect client for all its task runs: a sync task run inside an async flow run
    otherwise opens a client of its own (about 20 ms of TLS set-up each)."""
    with SyncClientContext.get_or_create():
        ledger = Ledger.connect()
        model = model_from_settings(settings)
        try:
            yield Tick(job, period, ledger, model,
                       CallLog(settings.model_call_log) if settings.model_call_log else None,
                       settings, flow_run_id, stop, revising)
        finally:
            model.close()
            ledger.close()


def run_tick(tick: Tick, identities: dict[str, RunIdentity]) -> TickReport:
    """Read the tick's finished Runs at once; the subjects not yet finished are registered and
    claimed a batch at a time (one task run each), and only claimed ones get stage task runs.
    The next batch is claimed when the last one has ended: a tick holds one batch's Runs,
    claims and futures, whatever its size."""
    # Retried like a stage: a tick that starts while the ledger's server restarts waits for it.
    finished = retried(lambda: tick.ledger.finished([i.run_id for i in identities.values()]),
                       tick.settings.task_retries, tick.settings.retry_delay_seconds)
    outcomes: dict[str, SubjectOutcome] = {}
    pending: list[tuple[str, RunIdentity]] = []
    for subject, identity in identities.items():
        run = finished.get(identity.run_id)
        if run is None:
            pending.append((subject, identity))
        else:
            outcomes[subject] = tick.emit(finished_outcome(tick, subject, identity, run))
    if pending:
        stages = configured_stages(tick.settings.task_retries,
                                   tick.settings.retry_delay_seconds)
        size = tick.settings.claim_batch
        for start in range(0, len(pending), size):
            outcomes.update(_run_batch(tick, stages, dict(pending[start:start + size])))
    return TickReport(tick.job.name, tick.job.version, tick.period,
                      [outcomes[s] for s in identities])


def _run_batch(tick: Tick, stages: Stages, batch: dict[str, RunIdentity]
               ) -> dict[str, SubjectOutcome]:
    """Register and claim one batch of subjects, then take the claimed ones through the
    stages; once the flow run stopped, a batch is left unclaimed for a later run."""
    if tick.stop.is_set():
        error = describe(stopped_before("register+claim"))
        return {subject: tick.emit(SubjectOutcome(subject, identity.run_id, "stopped",
                                                  error=error))
                for subject, identity in batch.items()}
    try:
        registrations: Mapping[str, Registration] = stage_value(
            stages.claim(quote(tick), quote(batch)))
    except Exception as exc:
        return {subject: tick.emit(SubjectOutcome(subject, identity.run_id, "failed",
                                                  error=describe(exc)))
                for subject, identity in batch.items()}
    outcomes: dict[str, SubjectOutcome] = {}
    claimed: dict[str, tuple[Run, Claim]] = {}
    for subject, registration in registrations.items():
        if registration.claim is not None:
            claimed[subject] = (registration.run, registration.claim)
        else:
            outcomes[subject] = tick.emit(unclaimed_outcome(subject, registration))
    if claimed:
        outcomes.update(_process_claimed(tick, stages, claimed))
    return outcomes


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
    model = LoggedModel(tick.model, tick.call_log, tick.job.name, subject, held.claim.run_id,
                        held.calls)
    try:
        return tick.job.transform(raw, model)
    except TransientError as exc:
        if exc.retry_after and (current_task_run.run_count or 1) <= tick.settings.task_retries:
            time.sleep(min(exc.retry_after, tick.settings.max_retry_after_seconds))
        raise


@task(name="persist", task_run_name="persist[{subject}]", **STAGE_OPTIONS)
def persist_output(subject: str, held: Held, candidate: Candidate) -> State[Any]:
    """Validate the candidate, then complete the Run with its outbox rows and business effect
    in one transaction; a moved fence discards the candidate."""
    tick, claim = held.tick, held.claim
    if (lost := lost_state(held.keeper, claim, "candidate discarded: ")) is not None:
        return lost
    tick.job.validate(candidate)
    output = candidate.output()
    messages = tick.messages(subject, output)
    try:
        done = tick.ledger.complete(
            claim, output, messages, tick.effect(output),
            CompletedBy(held.calls.value, tick.flow_run_id, str(current_task_run.id)),
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


def _process_claimed(tick: Tick, stages: Stages, claimed: dict[str, tuple[Run, Claim]]
                     ) -> dict[str, SubjectOutcome]:
    """Run the claimed subjects through the stages with bounded concurrency, while one keeper
    renews the leases of all those not yet finished, including those waiting for a slot; when
    the flow run stops, those still waiting are released at once."""
    outcomes: dict[str, SubjectOutcome] = {}
    with LeaseKeeper(tick.ledger, tick.lease_seconds) as keeper, \
            ThreadPoolExecutor(max_workers=tick.settings.subject_concurrency,
                               thread_name_prefix="subject") as pool:
        keeper.hold(claim for _, claim in claimed.values())
        # Taken as they end, cancelled ones too (as_completed never sees a future cancelled by
        # the executor's shutdown: only its done callbacks run).
        ended: queue.SimpleQueue[Future[SubjectOutcome]] = queue.SimpleQueue()
        futures: dict[Future[SubjectOutcome], str] = {}
        for s, (run, claim) in claimed.items():
            future = pool.submit(contextvars.copy_context().run, _process_apart, tick, stages,
                                 keeper, s, run, claim)
            futures[future] = s
            future.add_done_callback(ended.put)
        # Not when a slot frees up: a slow model call would hold the queue past the worker's
        # grace period, and SIGKILL would leave every queued Run leased.
        with tick.stop.on_set(functools.partial(pool.shutdown, wait=False,
                                                cancel_futures=True)):
            for _ in futures:
                future = ended.get()
                subject = futures[future]
                run, claim = claimed[subject]
                try:
                    outcome = (_release_queued(tick, keeper, subject, run, claim)
                               if future.cancelled() else future.result())
                except Exception as exc:  # the ledger itself failed: report it, keep the others
                    outcome = SubjectOutcome(subject, run.run_id, "failed", error=describe(exc))
                outcomes[subject] = tick.emit(outcome)
    return outcomes


def process_subject(tick: Tick, stages: Stages, keeper: LeaseKeeper, subject: str,
                    run: Run, claim: Claim) -> SubjectOutcome:
    """Take one claimed subject through the stages; every way out is a SubjectOutcome, and
    the claim leaves the keeper when the subject ends."""
    # quote(): Prefect would walk the tick (the job's subject list too) on every task call,
    # looking for futures. Raw input and candidate go unquoted, so that Prefect links each to
    # the task run that returned it: the UI's graph draws collect -> transform -> persist.
    hold = Held(tick, claim, keeper)
    held = quote(hold)
    try:
        # Streamed at the pace the Prefect server takes the tick's events, not all at once.
        tick.events.wait(tick.stop)
        raw = run.raw_input
        if raw is None:
            tick.check_running("collect")
            raw = stage_value(stages.collect(subject, held))
        # A candidate the model already produced is still persisted: that call is paid for.
        tick.check_running("transform")
        candidate = stage_value(stages.transform(subject, held, raw))
        persisted: Persisted = stage_value(stages.persist(subject, held, candidate))
    except LeaseLost as exc:
        return lease_lost_outcome(tick, subject, run.run_id, exc)
    except Exception as exc:
        return _fail(tick, claim, subject, exc, hold.calls.value)
    finally:
        keeper.release(claim)
    return SubjectOutcome(subject, run.run_id, "new", persisted.run.attempts,
                          persisted.outbox_rows, output=persisted.run.output)


def _process_apart(tick: Tick, stages: Stages, keeper: LeaseKeeper, subject: str, run: Run,
                   claim: Claim) -> SubjectOutcome:
    """``process_subject`` in a copy of the flow run context with task-result links of its own.

    Prefect links every task result (and each item of one) to its task run's State in the flow
    run context, to draw the graph's edges, and keeps the links until the flow run ends: a few
    kilobytes per subject. A subject's stages only look up its own, so they go with it."""
    context = FlowRunContext.get()
    assert context is not None  # submitted from inside the flow run
    with context.model_copy(update={"run_results": {}, "task_run_assets": {}}):
        return process_subject(tick, stages, keeper, subject, run, claim)


def _release_queued(tick: Tick, keeper: LeaseKeeper, subject: str, run: Run,
                    claim: Claim) -> SubjectOutcome:
    """A subject dropped from the queue when the flow run stopped: its Run is pending again."""
    try:
        return _fail(tick, claim, subject,
                     stopped_before("collect" if run.raw_input is None else "transform"))
    finally:
        keeper.release(claim)


def _fail(tick: Tick, claim: Claim, subject: str, error: BaseException,
          model_calls: int = 0) -> SubjectOutcome:
    """Record the failure and the model calls it cost: a transient one releases the Run for a
    later attempt, a permanent one marks it failed; a stopped flow run's subject is released
    and reported stopped."""
    message = describe(error)
    try:
        run = tick.ledger.fail(claim, message, retryable=is_transient(error),
                               model_calls=model_calls)
    except LeaseLost as lost:
        return lease_lost_outcome(tick, subject, claim.run_id, lost)
    outcome: Outcome = "stopped" if isinstance(error, FlowRunStopped) else "failed"
    return SubjectOutcome(subject, run.run_id, outcome, run.attempts, error=message)
