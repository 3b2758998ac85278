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
import logging
import queue
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from prefect import State, flow, get_run_logger, task
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext, SyncClientContext
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run
from prefect.runtime import task_run as current_task_run
from prefect.states import Completed, Failed
from prefect.tasks import Task
from prefect.utilities.annotations import quote

from flows.board import Board
from flows.budgeting import (
    OVER_BUDGET_STATE,
    estimator,
    exhausted_payload,
    overrun_payload,
    refusal_text,
)
from flows.errors import LeaseLapsed, NotReady, is_transient
from flows.events import emit_job_event
from flows.jobs import Candidate, Job, TransientError, ValidationFailed
from flows.jobs.schedule import require_due
from flows.model import CallBound, EndpointLimiter, RecordedModel, endpoint_named
from flows.registry import get_job
from flows.run_job.findings import (
    FINDINGS,
    describe,
    finding,
    lapsed_outcome,
    lease_lost_outcome,
    read_finished,
    unclaimed_outcome,
)
from flows.run_job.lease_keeper import LeaseKeeper
from flows.run_job.monitoring import (
    after_tick,
    cancelled_if_interrupted,
    label_flow_run,
    publish_artifacts,
    tick_artifact_key,
    wait_for_tick_artifacts,
)
from flows.run_job.outcomes import Outcome, SubjectOutcome, TickReport
from flows.run_job.preflight import NOT_READY_STATE, preflight
from flows.run_job.review import ask_for_review
from flows.run_job.shards import (
    ShardPlan,
    check_shard_label,
    run_shards,
    shard_outcomes,
    shard_size_for,
    split,
)
from flows.run_job.stages import (
    STAGE_OPTIONS,
    lease_lost_state,
    lost_state,
    retried,
    stage_value,
    with_retries,
)
from flows.run_job.stale import skip_tick, stale_reason
from flows.run_job.stop import FlowRunStopped, Stop, stopped_before
from flows.run_job.tick import Held, Persisted, Revising, Tick
from flows.settings import RunledgerSettings
from flows.spend import Spend, spend_of
from flows.targets import check_targets
from store import (
    BudgetExhausted,
    Claim,
    CompletedBy,
    LeaseLost,
    Ledger,
    Period,
    Registration,
    Run,
    RunIdentity,
    RunledgerError,
    Usage,
)

log = logging.getLogger(__name__)


# Async so that a flow run ends as soon as its work does: Prefect's sync flow engine waits for
# its heartbeat thread, which sleeps in whole seconds, when the flow returns (up to 1 s per run).
# The flow names its flow run itself, not through ``flow_run_name=``: Prefect resolves that
# before the flow starts, through a client of its own (TLS set-up, two round trips).
@flow(name="run-job", persist_result=False, log_prints=False,
      on_completion=[wait_for_tick_artifacts], on_failure=[wait_for_tick_artifacts],
      on_crashed=[cancelled_if_interrupted])
async def run_job(job: str, subjects: list[str] | None = None,
                  period: str | None = None, allow_not_due: bool = False,
                  shard_size: int | None = None, shard: str | None = None) -> State[Any]:
    """Run one tick of a job: every subject's Run is completed once, retries and reruns of the
    same period return the stored output.

    Args:
        job: Name of a registered job, e.g. competitor-summary or daily-credit.
        subjects: Subjects to run, e.g. ["acme"]; leave empty for all of the job's subjects.
        period: Which period to run or redo. Either a date YYYY-MM-DD (a day in the job's
            timezone), or an ISO datetime with an offset such as 2026-11-29T09:00:00+01:00
            (the period containing it). Leave empty for the latest period due at this flow
            run's scheduled time (a Quick run: the latest period due now).
        allow_not_due: Run a given period even though its occurrence is not due yet (refused
            otherwise: a completed Run never changes, so early content would stay).
        shard_size: Split a tick of a deployment with more subjects to run than this into
            shards of at most this many, each a flow run of this deployment that any worker of
            its work pool takes. Leave empty for the job's own shard size (none unless the job
            sets one: the tick runs in this flow run).
        shard: Set by a sharded tick on its shards ("2/4": shard 2 of 4); leave empty.
    """
    logger = get_run_logger()
    try:
        definition = get_job(job)
        the_period = nominal_period(definition, period)
        if period:
            require_due(definition, the_period, datetime.now(UTC), allow_not_due=allow_not_due)
        # Every identity is checked before anything is written.
        identities = {s: definition.identity(s, the_period)
                      for s in definition.resolve_subjects(subjects)}
        # A shard never shards again.
        size = None if check_shard_label(shard) else shard_size_for(definition, shard_size)
    except RunledgerError:
        await label_flow_run(f"{job}/invalid-input", None)
        raise
    settings = RunledgerSettings()
    try:  # before anything is written or paid for; a one-line state, not a traceback
        await asyncio.to_thread(preflight, definition, settings)
    except NotReady as exc:
        await label_flow_run(f"{definition.name}/{the_period.label}", definition)
        logger.error("%s", exc)
        return Failed(name=NOT_READY_STATE, message=str(exc))
    # Name and tags are monitoring: their API call need not hold up the tick.
    name = f"{definition.name}/{the_period.label}"
    labelling = asyncio.create_task(label_flow_run(
        name if shard is None else f"{name}/shard-{shard.replace('/', '-of-')}", definition))
    flow_run_id = str(current_flow_run.id)
    deployment_id = current_deployment.id
    if size is not None and deployment_id is None:
        logger.info("not sharded: only a flow run of a deployment spreads its tick over the "
                    "deployment's work pool; this one runs every subject itself")
        size = None
    stop = Stop()
    try:
        started = await asyncio.to_thread(
            run_ledgered_tick, definition, the_period, identities, settings, flow_run_id, stop,
            None if period else scheduled_start(), size)
        if isinstance(started, ShardPlan):
            assert deployment_id is not None  # a tick shards only from a deployment
            logger.info("%d subjects to run: %d shards of at most %d, run by the work pool",
                        sum(len(s.identities) for s in started.shards), len(started.shards),
                        size)
            flow_runs = await run_shards(deployment_id, definition, the_period, started.shards,
                                         allow_not_due,
                                         f"{flow_run_id}:{current_flow_run.run_count}")
            started = await asyncio.to_thread(finish_sharded_tick, definition, the_period,
                                              settings, flow_run_id, stop, started, flow_runs)
        report, board = started
    except BaseException:
        # Cancelled or timed out: the thread runs on (asyncio cannot stop it), but its subjects
        # start no more stages; asyncio.run waits for it before the process ends.
        stop.set()
        await asyncio.gather(labelling, return_exceptions=True)  # the tick's error is the news
        raise
    await labelling
    publish_artifacts(flow_run_id, tick_artifact_key(definition.name), report, board)
    if shard is None:  # a sharded tick asks once, for all its shards
        await ask_for_review(definition, the_period, flow_run_id, logger)
    if report.completed_every_subject() and len(identities) == len(definition.subject_names()):
        emit_job_event("tick.completed", definition, period=the_period.label)
    logger.info(report.summary())
    return report.final_state()


def nominal_period(job: Job, period: str | None) -> Period:
    """The explicit ``period`` if given, else the latest period due at the flow run's expected
    start (the same on every retry of this flow run): a scheduled slot's own period, and for a
    run made by hand never a period whose occurrence is not due yet. A ``period`` that is not a
    string (the API accepts any JSON value) is refused by ``parse_period`` as InvalidPeriod."""
    if period is not None and (not isinstance(period, str) or period.strip()):
        return job.parse_period(period)
    return job.latest_due_period(scheduled_start())


def scheduled_start() -> datetime:
    """This flow run's expected start: its slot for a scheduled run (kept across retries), its
    creation for one made by hand."""
    return datetime.fromtimestamp(current_flow_run.scheduled_start_time.timestamp(), UTC)


def run_ledgered_tick(job: Job, period: Period, identities: dict[str, RunIdentity],
                      settings: RunledgerSettings, flow_run_id: str,
                      stop: Stop, expected_start: datetime | None = None,
                      shard_size: int | None = None
                      ) -> tuple[TickReport, Board | None] | ShardPlan:
    """The tick's blocking part, in a thread of its own: ledger, model and stage task runs,
    then the count of its Runs asked for again and the job's status board as the tick left it
    (None if it could not be read). A tick of
    no explicit period, expected at ``expected_start``, that starts too late may be skipped by
    its job's missed-run policy (``stale_reason``). With more than ``shard_size`` subjects to
    run, it runs none: their shards are returned, for ``run_shards``."""
    with ledgered(job, period, settings, flow_run_id, stop) as tick:
        stale = (None if expected_start is None
                 else stale_reason(job, period, expected_start,
                                   retried(tick.ledger.now, settings.task_retries,
                                           settings.retry_delay_seconds)))
        if stale is not None:
            report = skip_tick(tick, identities, stale)
            return report, after_tick(tick.ledger, job, report)
        outcomes, to_run = read_finished(tick, identities)
        if shard_size is not None and len(to_run) > shard_size:
            return ShardPlan(list(identities), outcomes, split(to_run, shard_size))
        report = run_tick(tick, identities, outcomes, to_run)
        return report, after_tick(tick.ledger, job, report)


def finish_sharded_tick(job: Job, period: Period, settings: RunledgerSettings,
                        flow_run_id: str, stop: Stop, plan: ShardPlan,
                        flow_runs: list[FlowRun]) -> tuple[TickReport, Board | None]:
    """A sharded tick once its shards have ended: every subject's outcome (the shards' from the
    ledger, in two reads) and the job's board. Only the tick's own findings are counted as
    suppressed: each shard counted its own."""
    with ledgered(job, period, settings, flow_run_id, stop) as tick:
        ids = [i.run_id for shard in plan.shards for i in shard.identities.values()]
        runs = retried(lambda: tick.ledger.get_many(ids), settings.task_retries,
                       settings.retry_delay_seconds)
        completed = [r.run_id for r in runs.values() if r.status == "completed"]
        calls = retried(lambda: tick.ledger.calls.of_runs(completed), settings.task_retries,
                        settings.retry_delay_seconds)
        outcomes = {**plan.finished,
                    **shard_outcomes(tick, runs, calls, plan.shards, flow_runs)}
        report = TickReport(job.name, job.version, period, [outcomes[s] for s in plan.subjects])
        own = TickReport(job.name, job.version, period, list(plan.finished.values()))
        return report, after_tick(tick.ledger, job, own)


@contextmanager
def ledgered(job: Job, period: Period, settings: RunledgerSettings, flow_run_id: str,
             stop: Stop, revising: Revising | None = None) -> Iterator[Tick]:
    """A Tick with its own ledger connection and model client, closed when it ends, inside one
    sync Prefect client for all its task runs: a sync task run inside an async flow run
    otherwise opens a client of its own (about 20 ms of TLS set-up each)."""
    with SyncClientContext.get_or_create():
        endpoint = endpoint_named(job.endpoint, settings)  # unknown: refused, nothing written
        ledger = Ledger.connect()
        model = endpoint.model()
        try:
            prices = endpoint.prices()
            if job.budget is not None:  # before any Run is claimed: nothing is written
                job.budget.check_prices(job.name, model.name, prices)
            # The database clock, read only for a budget, and retried like the tick's first
            # read: a tick may start while the ledger's server restarts.
            spend = None if job.budget is None else estimator(
                job.name, job.budget, prices, period,
                retried(ledger.now, settings.task_retries, settings.retry_delay_seconds))
            limits = endpoint.limits
            limiter = None
            if limits is not None:  # the endpoint's shared limits, as this worker knows them
                retried(lambda: ledger.calls.configure_endpoint(endpoint.name, limits),
                        settings.task_retries, settings.retry_delay_seconds)
                limiter = EndpointLimiter(ledger.calls, endpoint.name,
                                          in_flight_seconds=endpoint.timeout_seconds,
                                          max_pause_seconds=settings.max_retry_after_seconds,
                                          bounds_in_flight=limits.max_concurrent is not None,
                                          sleep=stop.sleep)
            yield Tick(job, period, ledger, model, prices, spend, settings, flow_run_id, stop,
                       revising, limiter=limiter,
                       endpoint_concurrency=None if limits is None else limits.max_concurrent)
        finally:
            model.close()
            ledger.close()


def run_tick(tick: Tick, identities: dict[str, RunIdentity],
             outcomes: dict[str, SubjectOutcome], to_run: dict[str, RunIdentity]) -> TickReport:
    """Given the outcomes of the tick's finished Runs (``read_finished``), the subjects not
    yet finished are registered and claimed a batch at a time (one task run each), and only
    claimed ones get stage task runs. The next batch is claimed when the last one has ended: a
    tick holds one batch's Runs, claims and futures, whatever its size."""
    if to_run:
        pending = list(to_run.items())
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
    model = RecordedModel(tick.model, tick.ledger.calls, held.claim, tick.prices, held.calls,
                          budgeting=tick.estimator, limiter=tick.limiter,
                          refused_for_seconds=tick.settings.model_refused_for_seconds,
                          overran=functools.partial(_overran, tick, subject))
    try:
        return tick.job.transform(raw, model)
    except BudgetExhausted as exc:
        # Not a failure, and not for Prefect to retry: the Run waits for room in the budget.
        return Completed(name=OVER_BUDGET_STATE, message=str(exc), data=exc)
    except LeaseLost as exc:  # another attempt took the Run over during a model call
        return lease_lost_state(exc)
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
            ThreadPoolExecutor(max_workers=tick.subject_concurrency,
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
    except LeaseLapsed as exc:
        return _spent(lapsed_outcome(subject, run, exc), tick, hold)
    except LeaseLost as exc:
        return lease_lost_outcome(tick, subject, run.run_id, exc)
    except BudgetExhausted as exc:
        return _over_budget(tick, claim, subject, exc, hold)
    except Exception as exc:
        return _spent(_fail(tick, claim, subject, exc, hold.calls.value), tick, hold)
    finally:
        keeper.release(claim)
    return replace(_spent(SubjectOutcome(subject, run.run_id, "new", persisted.run.attempts,
                                         persisted.outbox_rows, output=persisted.run.output),
                          tick, hold), run_spend=run_spend(tick, hold))


def _spent(outcome: SubjectOutcome, tick: Tick, hold: Held) -> SubjectOutcome:
    """The outcome with what its attempt's transform did with the model."""
    return replace(outcome, spend=hold.calls, currency=tick.prices.currency)


def run_spend(tick: Tick, hold: Held) -> Spend | None:
    """What the Run this attempt completed spent over all its attempts, as the ledger's call
    records say. At fence 1 no other attempt ever held the Run (every claim moves the fence,
    and every call record is fenced), so they are the records this attempt wrote, which it
    kept: no read, the Run's round trips stay five. After earlier attempts (a crash, an
    expired lease, a release), one read of the Run's records; a ledger that cannot give them
    leaves the figure out, logged: the Run is completed whatever its event says."""
    if hold.claim.fence == 1:
        return spend_of(hold.calls.records)
    try:
        calls = retried(lambda: tick.ledger.calls.of_run(hold.claim.run_id),
                        tick.settings.task_retries, tick.settings.retry_delay_seconds)
    except RunledgerError:
        log.warning("could not read the model calls of run %s; its completed event goes "
                    "without the Run's spend", hold.claim.run_id, exc_info=True)
        return None
    return spend_of([c.model_dump() for c in calls])


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


def _over_budget(tick: Tick, claim: Claim, subject: str, refused: BudgetExhausted,
                 hold: Held) -> SubjectOutcome:
    """The budget refused the subject's next model call: its Run is pending again with its
    attempt given back (owed: reconcile runs it when there is room), and the first refusal of
    the window says so once, as an event."""
    budget = tick.job.budget
    assert budget is not None  # only a job with a budget reserves
    message = refusal_text(budget, refused)
    try:
        tick.ledger.calls.release_over_budget(claim, message)
    except LeaseLost as lost:
        return lease_lost_outcome(tick, subject, claim.run_id, lost)
    if refused.first:
        emit_job_event("budget.exhausted", tick.job, **exhausted_payload(budget, refused))
    return _spent(SubjectOutcome(subject, claim.run_id, "over-budget", error=message), tick, hold)


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
