"""The ``run-job`` flow: one tick of a job, each subject's Run registered, claimed, collected,
transformed and persisted at most once, whatever retries, overlaps or reruns happen.

Per tick: one batched read, then one register+claim task run for every subject not yet
finished, one lease keeper for all the claims; per claimed subject: collect, transform, persist.

The ledger is the authority: Prefect's retries only repeat a stage, Prefect's caching is off,
and the nominal time comes from the flow run's expected start (or the ``period`` parameter),
never from a worker's clock."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal

import sqlalchemy as sa
from prefect import State, flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, TaskRun
from prefect.context import SyncClientContext
from prefect.results import ResultRecord  # type: ignore[attr-defined]  # re-exported there
from prefect.runtime import flow_run as current_flow_run
from prefect.runtime import task_run as current_task_run
from prefect.states import Completed
from prefect.tasks import Task, exponential_backoff
from prefect.utilities.annotations import quote

from flows.jobs import Candidate, Job, TransientError, get_job, is_transient
from flows.lease_keeper import LeaseKeeper
from flows.model import CallLog, LoggedModel, Model, model_from_settings
from flows.outcomes import Outcome, SubjectOutcome, TickReport, emit_outcome
from flows.settings import RunledgerSettings
from store import (
    Claim,
    FinishedRun,
    LeaseLost,
    Ledger,
    OutboxMessage,
    Period,
    Registration,
    Run,
    RunIdentity,
    RunledgerError,
    params_fingerprint,
)

RETRY_JITTER_FACTOR = 0.5

Finding = Literal["claimed", "duplicate", "in-progress-elsewhere", "conflict", "failed"]
FINDINGS: tuple[Finding, ...] = ("claimed", "duplicate", "in-progress-elsewhere", "conflict",
                                 "failed")


class FlowRunStopped(TransientError):
    """The flow run was cancelled or timed out before this subject reached a stage: its Run is
    released (pending) for a later run instead of spending a model call nobody waits for."""


class Stop:
    """Set once when the flow run is cancelled or times out. The tick's thread cannot be
    interrupted, so its subjects look here before each stage that costs, and whoever waits for
    them registers what to drop at once (``on_set``): subjects still queued behind a slow stage
    must be released before the worker's grace period ends in SIGKILL."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the stop is set (now, if it already is); it must not block."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback()


def _stopped_before(stage: str) -> FlowRunStopped:
    return FlowRunStopped(f"the flow run was cancelled or timed out before {stage}; "
                          "the Run is released for a later run")


@dataclass(frozen=True)
class Tick:
    """Everything the stages of one flow run share."""

    job: Job
    period: Period
    ledger: Ledger
    model: Model
    call_log: CallLog | None
    settings: RunledgerSettings
    flow_run_id: str
    stop: Stop = field(default_factory=Stop)

    @property
    def lease_seconds(self) -> float:
        return self.settings.lease_seconds or self.job.lease_seconds

    def owner(self, task_run_id: str) -> str:
        """A unique owner per attempt: owner equality lets a claim be taken again."""
        return f"{socket.gethostname()}:{os.getpid()}:{self.flow_run_id}/{task_run_id}"

    def check_running(self, stage: str) -> None:
        """Raise FlowRunStopped if the flow run stopped before ``stage``."""
        if self.stop.is_set():
            raise _stopped_before(stage)

    def emit(self, outcome: SubjectOutcome) -> SubjectOutcome:
        emit_outcome(self.job.name, self.job.version, self.period, outcome)
        return outcome


@dataclass(frozen=True)
class Held:
    """A claimed subject's hold on its Run, which every stage of that subject presents: the
    tick, the claim and the keeper renewing its lease."""

    tick: Tick
    claim: Claim
    keeper: LeaseKeeper


class Persisted:
    """The Run this attempt completed, and how many outbox rows it queued.

    A plain class, not a dataclass: Prefect walks a task's return value (dataclasses and
    pydantic models field by field) looking for futures, and the Run carries its raw input
    and output; it leaves other objects alone."""

    __slots__ = ("outbox_rows", "run")

    def __init__(self, run: Run, outbox_rows: int) -> None:
        self.run = run
        self.outbox_rows = outbox_rows


def _retry_if_transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    return isinstance(state.data, BaseException) and is_transient(state.data)


def _named(name: str, message: str, data: Any) -> State[Any]:
    return Completed(name=name, message=message, data=data)


STAGE: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


def _finding(registration: Registration) -> Finding:
    """What register+claim found for one Run."""
    if registration.claim is not None:
        return "claimed"
    if registration.conflict is not None:
        return "conflict"
    if registration.run.status == "completed":
        return "duplicate"
    if registration.run.status == "failed":
        return "failed"
    return "in-progress-elsewhere"


def _register_and_claim_name(parameters: dict[str, Any]) -> str:
    return f"register+claim[{len(parameters['identities'])} subjects]"


# Prefect calls a name callback with the parameters when it has a ``parameters`` argument; its
# Protocol for that also demands a classmethod no plain function has.
@task(name="register+claim", task_run_name=_register_and_claim_name,  # type: ignore[arg-type]
      **STAGE)
def register_and_claim(tick: Tick, identities: dict[str, RunIdentity]) -> State[Any]:
    """Register every subject's Run (one row per identity) and take the leases nobody else
    holds, in one ledger call for the whole tick; returns each subject's Registration."""
    found = tick.ledger.register_and_claim_many(
        [(identity, tick.job.run_params(subject, tick.period))
         for subject, identity in identities.items()],
        owner=tick.owner(str(current_task_run.id)), lease=tick.lease_seconds,
    )
    registrations = {subject: found[identity.run_id] for subject, identity in identities.items()}
    counts = Counter(_finding(r) for r in registrations.values())
    # A read-only view, not the dict: Prefect walks a returned dict (every Registration, every
    # Run's fields) looking for futures, and leaves a mapping of another type alone.
    return Completed(message=", ".join(f"{counts[f]} {f.replace('-', ' ')}" for f in FINDINGS),
                     data=MappingProxyType(registrations))


def _lost_state(keeper: LeaseKeeper, claim: Claim, consequence: str = "") -> State[Any] | None:
    """A LeaseLost state when the keeper found the claim's fence moved on, else None."""
    reason = keeper.lost(claim)
    if reason is None:
        return None
    error = LeaseLost(f"{consequence}{reason}")
    return _named("LeaseLost", str(error), error)


@task(name="collect", task_run_name="collect[{subject}]", **STAGE)
def collect_input(subject: str, held: Held) -> State[Any] | dict[str, Any]:
    """Collect the raw input and store it once; the stored value (maybe an earlier one) wins."""
    if (lost := _lost_state(held.keeper, held.claim)) is not None:
        return lost
    raw = held.tick.job.collect(subject, held.tick.period)
    try:
        return held.tick.ledger.save_input(held.claim, raw)
    except LeaseLost as exc:
        return _named("LeaseLost", str(exc), exc)


@task(name="transform", task_run_name="transform[{subject}]", **STAGE)
def transform_input(subject: str, held: Held, raw: dict[str, Any]) -> State[Any] | Candidate:
    """Ask the model for a candidate; a lease already lost skips the model call."""
    tick = held.tick
    if (lost := _lost_state(held.keeper, held.claim)) is not None:
        return lost
    model = LoggedModel(tick.model, tick.call_log, tick.job.name, subject, held.claim.run_id)
    try:
        return tick.job.transform(raw, model)
    except TransientError as exc:
        if exc.retry_after and (current_task_run.run_count or 1) <= tick.settings.task_retries:
            time.sleep(min(exc.retry_after, tick.settings.max_retry_after_seconds))
        raise


@task(name="persist", task_run_name="persist[{subject}]", **STAGE)
def persist_output(subject: str, held: Held, candidate: Candidate) -> State[Any]:
    """Validate the candidate, then complete the Run with its outbox rows and business effect
    in one transaction; a moved fence discards the candidate."""
    tick, claim = held.tick, held.claim
    if (lost := _lost_state(held.keeper, claim, "candidate discarded: ")) is not None:
        return lost
    tick.job.validate(candidate)
    output = candidate.output()
    messages: list[OutboxMessage] = list(tick.job.messages(subject, tick.period, output))
    effect = tick.job.effect
    try:
        done = tick.ledger.complete(
            claim, output, messages,
            None if effect is None else (lambda session: effect(session, output)),
        )
    except LeaseLost as exc:
        return _named("LeaseLost", f"candidate discarded: {exc}", exc)
    # A retry after a lost reply finds the Run completed by this very attempt.
    if done.new or done.run.completed_attempt_id == claim.attempt_id:
        rows = len({(m.channel, m.recipient) for m in messages})
        return Completed(message=f"completed with {rows} outbox rows",
                         data=Persisted(done.run, rows))
    error = LeaseLost(f"run {claim.run_id} was completed by another attempt; candidate discarded")
    return _named("LeaseLost", str(error), error)


def _value(returned: Any) -> Any:
    """A stage's value. A stage that returned a named state hands back that state, whose data
    is in memory (results are not persisted); a lost lease is raised as LeaseLost."""
    if isinstance(returned, State):
        data = returned.data
        returned = data.result if isinstance(data, ResultRecord) else data
    if isinstance(returned, LeaseLost):
        raise returned
    return returned


def _with_retries(stage: Task[..., Any], retries: int, delay_seconds: float) -> Task[..., Any]:
    return stage.with_options(
        retries=retries,
        retry_delay_seconds=exponential_backoff(delay_seconds),
        retry_jitter_factor=RETRY_JITTER_FACTOR,
        retry_condition_fn=_retry_if_transient,
    )


@dataclass(frozen=True)
class Stages:
    """The stage tasks (register+claim once per tick, the others once per claimed subject),
    with this flow run's retry policy for transient failures."""

    claim: Task[..., Any]
    collect: Task[..., Any]
    transform: Task[..., Any]
    persist: Task[..., Any]

    @classmethod
    def configured(cls, settings: RunledgerSettings) -> Stages:
        return _configured_stages(settings.task_retries, settings.retry_delay_seconds)


@functools.lru_cache(maxsize=16)
def _configured_stages(retries: int, delay_seconds: float) -> Stages:
    # Copying four tasks with new options costs a few milliseconds: once per retry policy.
    return Stages(*(_with_retries(t, retries, delay_seconds) for t in
                    (register_and_claim, collect_input, transform_input, persist_output)))


def _lease_lost(tick: Tick, subject: str, run_id: str, error: LeaseLost) -> SubjectOutcome:
    """Another attempt holds the Run now: this one's candidate is gone, which is no failure."""
    return SubjectOutcome(subject, run_id, "lease-lost", tick.ledger.get(run_id).attempts,
                          error=str(error))


def _fail(tick: Tick, claim: Claim, subject: str, error: BaseException) -> SubjectOutcome:
    """Record the failure: a transient one releases the Run for a later attempt, a permanent
    one marks it failed; a stopped flow run's subject is released and reported stopped."""
    message = f"{type(error).__name__}: {error}"
    try:
        run = tick.ledger.fail(claim, message, retryable=is_transient(error))
    except LeaseLost as lost:
        return _lease_lost(tick, subject, claim.run_id, lost)
    outcome: Outcome = "stopped" if isinstance(error, FlowRunStopped) else "failed"
    return SubjectOutcome(subject, run.run_id, outcome, run.attempts, error=message)


def process_subject(tick: Tick, stages: Stages, keeper: LeaseKeeper, subject: str,
                    run: Run, claim: Claim) -> SubjectOutcome:
    """Take one claimed subject through the stages; every way out is a SubjectOutcome, and
    the claim leaves the keeper when the subject ends."""
    # quote(): Prefect would otherwise walk the tick (the job's subject list among them) on
    # every task call, looking for futures. The raw input and the candidate are passed as they
    # are, so that Prefect links each to the task run that returned it: the UI's run graph then
    # draws collect -> transform -> persist for every subject.
    held = quote(Held(tick, claim, keeper))
    try:
        raw = run.raw_input
        if raw is None:
            tick.check_running("collect")
            raw = _value(stages.collect(subject, held))
        # A candidate the model already produced is still persisted: that call is paid for.
        tick.check_running("transform")
        candidate = _value(stages.transform(subject, held, raw))
        persisted: Persisted = _value(stages.persist(subject, held, candidate))
    except LeaseLost as exc:
        return _lease_lost(tick, subject, run.run_id, exc)
    except Exception as exc:
        return _fail(tick, claim, subject, exc)
    finally:
        keeper.release(claim)
    return SubjectOutcome(subject, run.run_id, "new", persisted.run.attempts,
                          persisted.outbox_rows, output=persisted.run.output)


def _failed_permanently(subject: str, run: Run | FinishedRun) -> SubjectOutcome:
    return SubjectOutcome(
        subject, run.run_id, "failed", run.attempts,
        error=f"failed permanently ({run.error}); requeue it with "
              f"`runledger runs requeue {run.run_id}`",
    )


def _unclaimed_outcome(subject: str, registration: Registration) -> SubjectOutcome:
    """The outcome of a subject whose Run register+claim did not claim."""
    run = registration.run
    finding = _finding(registration)
    if finding == "conflict":
        return SubjectOutcome(subject, run.run_id, "failed", run.attempts,
                              error=f"{type(registration.conflict).__name__}: "
                                    f"{registration.conflict}")
    if finding == "failed":
        return _failed_permanently(subject, run)
    if finding == "duplicate":
        return SubjectOutcome(subject, run.run_id, "duplicate", run.attempts, output=run.output)
    # What on-call needs to decide whether to wait: who holds the Run, and until when.
    until = run.lease_expires_at.isoformat(timespec="seconds") if run.lease_expires_at else "?"
    return SubjectOutcome(subject, run.run_id, "in-progress-elsewhere", run.attempts,
                          error=f"leased by {run.owner} until {until}")


def _known_outcome(tick: Tick, subject: str, identity: RunIdentity,
                   run: FinishedRun) -> SubjectOutcome:
    """The outcome of a Run the batched read found finished."""
    if run.status == "failed":
        return _failed_permanently(subject, run)
    params = tick.job.run_params(subject, tick.period)
    if params_fingerprint(params) != run.params_fingerprint:
        try:
            tick.ledger.register(identity, params)  # raises RunConflict and writes nothing
        except RunledgerError as exc:
            return SubjectOutcome(subject, run.run_id, "failed", run.attempts,
                                  error=f"{type(exc).__name__}: {exc}")
    return SubjectOutcome(subject, run.run_id, "duplicate", run.attempts, output=run.output)


def _release_queued(tick: Tick, keeper: LeaseKeeper, subject: str, run: Run,
                    claim: Claim) -> SubjectOutcome:
    """A subject dropped from the queue when the flow run stopped: its Run is pending again."""
    try:
        return _fail(tick, claim, subject,
                     _stopped_before("collect" if run.raw_input is None else "transform"))
    finally:
        keeper.release(claim)


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
            future = pool.submit(contextvars.copy_context().run, process_subject, tick, stages,
                                 keeper, s, run, claim)
            futures[future] = s
            future.add_done_callback(ended.put)
        # Not when a slot frees up: a slow model call would hold the queue past the worker's
        # grace period, and SIGKILL would leave every queued Run leased.
        tick.stop.on_set(functools.partial(pool.shutdown, wait=False, cancel_futures=True))
        for _ in futures:
            future = ended.get()
            subject = futures[future]
            run, claim = claimed[subject]
            try:
                outcome = (_release_queued(tick, keeper, subject, run, claim)
                           if future.cancelled() else future.result())
            except Exception as exc:  # the ledger itself failed: report it, keep the others
                outcome = SubjectOutcome(subject, run.run_id, "failed",
                                         error=f"{type(exc).__name__}: {exc}")
            outcomes[subject] = tick.emit(outcome)
    return outcomes


def run_tick(tick: Tick, identities: dict[str, RunIdentity]) -> TickReport:
    """Read the tick's finished Runs at once; only subjects not yet finished are registered
    and claimed (one task run for all of them), and only claimed ones get stage task runs."""
    finished = tick.ledger.finished([i.run_id for i in identities.values()])
    outcomes: dict[str, SubjectOutcome] = {}
    pending: dict[str, RunIdentity] = {}
    for subject, identity in identities.items():
        run = finished.get(identity.run_id)
        if run is None:
            pending[subject] = identity
        else:
            outcomes[subject] = tick.emit(_known_outcome(tick, subject, identity, run))
    if pending:
        stages = Stages.configured(tick.settings)
        try:
            registrations: Mapping[str, Registration] = _value(
                stages.claim(quote(tick), quote(pending)))
        except Exception as exc:
            registrations = {}
            for subject, identity in pending.items():
                outcomes[subject] = tick.emit(SubjectOutcome(
                    subject, identity.run_id, "failed", error=f"{type(exc).__name__}: {exc}"))
        claimed: dict[str, tuple[Run, Claim]] = {}
        for subject, registration in registrations.items():
            if registration.claim is not None:
                claimed[subject] = (registration.run, registration.claim)
            else:
                outcomes[subject] = tick.emit(_unclaimed_outcome(subject, registration))
        if claimed:
            outcomes.update(_process_claimed(tick, stages, claimed))
    return TickReport(tick.job.name, tick.job.version, tick.period,
                      [outcomes[s] for s in identities])


def nominal_period(job: Job, period: str | None) -> Period:
    """The explicit ``period`` if given, else the period containing the flow run's expected
    start time (the same on every retry of this flow run)."""
    if period is not None and period.strip():
        return job.parse_period(period)
    scheduled = current_flow_run.scheduled_start_time
    return job.period_at(datetime.fromtimestamp(scheduled.timestamp(), UTC))


def ensure_tables(job: Job, ledger: Ledger) -> None:
    """Create the job's business tables on first use (not the ledger's: Alembic owns those)."""
    if job.tables is None:
        return
    try:
        job.tables.create_all(ledger.engine, checkfirst=True)
    except (sa.exc.ProgrammingError, sa.exc.IntegrityError, sa.exc.OperationalError):
        # Another worker created them between our check and our CREATE: check again.
        job.tables.create_all(ledger.engine, checkfirst=True)


async def _label_flow_run(name: str, job: Job | None) -> None:
    """Name the flow run ``{job}/{period}`` and tag it (not its task runs: a tagged task run
    asks the server for tag concurrency slots, one round trip per task run) with the job and
    its version, in one API call. A refused call is logged, not raised: name and tags are
    monitoring, and failing a flow run whose tick the ledger completed would page someone for
    nothing."""
    labels = set() if job is None else {f"job:{job.name}", f"version:{job.version}"}
    try:
        async with get_client() as client:
            await client.update_flow_run(current_flow_run.id, name=name,
                                         tags=sorted({*current_flow_run.tags, *labels}))
    except Exception:
        get_run_logger().warning("could not name the flow run %r", name, exc_info=True)


def run_ledgered_tick(job: Job, period: Period, identities: dict[str, RunIdentity],
                      settings: RunledgerSettings, flow_run_id: str,
                      stop: Stop) -> TickReport:
    """The tick's blocking part, in a thread of its own: ledger, model and stage task runs."""
    # One sync Prefect client for every task run of the tick: a sync task run inside an async
    # flow run otherwise opens a client of its own (about 20 ms of TLS set-up each).
    with SyncClientContext.get_or_create():
        ledger = Ledger.connect()
        model = model_from_settings(settings)
        try:
            ensure_tables(job, ledger)
            tick = Tick(job, period, ledger, model,
                        CallLog(settings.model_call_log) if settings.model_call_log else None,
                        settings, flow_run_id, stop)
            return run_tick(tick, identities)
        finally:
            model.close()
            ledger.close()


# A tick artifact's API call queues behind the server's backlog of the tick's task-run events
# (about half a second at 1,000 subjects), and so does the call that records the flow run's
# final state: the artifact is created concurrently with that call, and the flow run's end
# hook waits for it.
ARTIFACT_WAIT_SECONDS = 60.0
_artifacts: dict[str, asyncio.Task[None]] = {}


def _publish_artifact(flow_run_id: str, key: str, report: TickReport) -> None:
    """Start creating the tick's Markdown artifact; ``wait_for_tick_artifact`` awaits it."""
    async def create() -> None:
        try:
            await acreate_markdown_artifact(markdown=report.markdown(), key=key,
                                            description=report.summary())
        except Exception:  # monitoring only: the ledger already holds every outcome
            get_run_logger().warning("could not create the tick artifact %r", key, exc_info=True)

    _artifacts[flow_run_id] = asyncio.create_task(create(), name=f"tick-artifact-{flow_run_id}")


async def wait_for_tick_artifact(flow: Any, flow_run: FlowRun, state: State[Any]) -> None:
    """Flow run hook: a flow run that has ended has its tick artifact."""
    created = _artifacts.pop(str(flow_run.id), None)
    if created is not None:
        await asyncio.wait_for(created, ARTIFACT_WAIT_SECONDS)


# Async so that a flow run ends as soon as its work does: Prefect's sync flow engine waits for
# its heartbeat thread, which sleeps in whole seconds, when the flow returns (up to 1 s per run).
# The flow run is named by the flow itself, not by ``flow_run_name=``: Prefect resolves that
# before the flow starts, through a client of its own (TLS set-up, two round trips).
@flow(name="run-job", persist_result=False, log_prints=False,
      on_completion=[wait_for_tick_artifact], on_failure=[wait_for_tick_artifact])
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
        await _label_flow_run(f"{job}/invalid-input", None)
        raise
    settings = RunledgerSettings()
    # Name and tags are monitoring: their API call need not hold up the tick.
    labelling = asyncio.create_task(
        _label_flow_run(f"{definition.name}/{the_period.label}", definition))
    flow_run_id = str(current_flow_run.id)
    stop = Stop()
    try:
        report = await asyncio.to_thread(run_ledgered_tick, definition, the_period, identities,
                                         settings, flow_run_id, stop)
    except BaseException:
        # Cancelled or timed out: the thread runs on (asyncio cannot stop it), but its subjects
        # start no more stages; asyncio.run waits for it before the process ends.
        stop.set()
        await asyncio.gather(labelling, return_exceptions=True)  # the tick's error is the news
        raise
    await labelling
    _publish_artifact(flow_run_id, f"{definition.name}-tick", report)
    logger.info(report.summary())
    return report.final_state()
