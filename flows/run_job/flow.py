"""The ``run-job`` flow: one tick of a job, each subject's Run registered, claimed, collected,
transformed and persisted at most once, whatever retries, overlaps or reruns happen.

Per tick: one batched read; then, a batch of subjects not yet finished at a time, one
register+claim task run and one lease keeper for its claims; per claimed subject: collect,
transform, persist.

The ledger is the authority: Prefect's retries only repeat a stage, Prefect's caching is off,
and the nominal time comes from the flow run's expected start (or the ``period`` parameter),
never from a worker's clock.

This module reads top-down: the flow, then its tick's blocking part (run here, or cut into
shards) and the resources it holds. Beside it: ``subjects`` (the subjects taken through the
stages), ``tasks`` (the stage tasks), ``tick`` (what the stages share), ``stages`` (a stage's
Prefect options and states), ``shards``, ``findings`` (ledger findings as outcomes), ``stop``,
``monitoring``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from prefect import State, flow, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.context import SyncClientContext
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run
from prefect.states import Failed

from flows.batches.submit import Submitted, submit_queued
from flows.board import Board
from flows.budgeting import estimator
from flows.errors import NotReady
from flows.events import emit_job_event
from flows.jobs import Job
from flows.jobs.schedule import require_due
from flows.model import BatchQueue, EndpointLimiter, endpoint_named
from flows.registry import get_job
from flows.run_job.findings import read_finished
from flows.run_job.monitoring import (
    after_tick,
    cancelled_if_interrupted,
    label_flow_run,
    publish_artifacts,
    tick_artifact_key,
    wait_for_tick_artifacts,
)
from flows.run_job.outcomes import TickReport
from flows.run_job.preflight import NOT_READY_STATE, preflight
from flows.run_job.review import ask_for_review
from flows.run_job.shards import (
    ShardPlan,
    current_shard,
    run_shards,
    shard_outcomes,
    shard_size_for,
    split,
)
from flows.run_job.stages import retried
from flows.run_job.stale import skip_tick, stale_reason
from flows.run_job.stop import Stop
from flows.run_job.subjects import run_tick
from flows.run_job.tick import Revising, Tick
from flows.settings import RunledgerSettings
from store import CreateInDoubt, InvalidInput, Ledger, Period, RunIdentity, RunledgerError

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
                  shard_size: int | None = None, batch: bool | None = None) -> State[Any]:
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
        batch: Send the model calls through the provider's Batch API at its batch price:
            the tick queues them and ends AwaitingBatch, its Runs wait without a worker, and
            the settle-batches deployment finishes them once the batch has ended (a batch
            tick is not sharded). Leave empty for the job's own choice (Job(batch=...)).
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
        # A shard (told so by its tick, not by a parameter) never shards again.
        shard = current_shard()
        size = None if shard else shard_size_for(definition, shard_size)
        batched = definition.batch if batch is None else batch
        if not isinstance(batched, bool):
            raise InvalidInput(f"batch must be true or false (or empty: the job's own), "
                               f"got {batch!r}")
    except RunledgerError:
        await label_flow_run(f"{job}/invalid-input", None)
        raise
    settings = RunledgerSettings()
    try:  # before anything is written or paid for; a one-line state, not a traceback
        await asyncio.to_thread(preflight, definition, settings, batch=batched)
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
    if size is not None and batched:
        logger.info("not sharded: a batch tick holds no worker while its batch runs, so it "
                    "runs every subject itself")
        size = None
    stop = Stop()
    try:
        started = await asyncio.to_thread(
            run_ledgered_tick, definition, the_period, identities, settings, flow_run_id, stop,
            None if period else scheduled_start(), size, batched)
        if started.kind == "sharded":
            assert deployment_id is not None  # a tick shards only from a deployment
            plan = started.sharded()
            logger.info("%d subjects to run: %d shards of at most %d, run by the work pool",
                        sum(len(s.identities) for s in plan.shards), len(plan.shards), size)
            flow_runs = await run_shards(deployment_id, definition, the_period, plan.shards,
                                         allow_not_due,
                                         f"{flow_run_id}:{current_flow_run.run_count}")
            started = await asyncio.to_thread(finish_sharded_tick, definition, the_period,
                                              settings, flow_run_id, stop, plan, flow_runs)
        report, board = started.ran()
    except BaseException:
        # Cancelled or timed out: the thread runs on (asyncio cannot stop it), but its subjects
        # start no more stages; asyncio.run waits for it before the process ends.
        stop.set()
        await asyncio.gather(labelling, return_exceptions=True)  # the tick's error is the news
        raise
    await labelling
    for submitted in report.batches:
        emit_job_event("batch.submitted", definition, period=the_period.label,
                       batch=submitted.key, provider_batch_id=submitted.provider_batch_id,
                       requests=submitted.requests)
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


@dataclass(frozen=True)
class TickResult:
    """What a tick's blocking part came to, one kind of result whatever happened: ``ran`` (its
    report and the job's status board as the tick left it, None if it could not be read) or
    ``sharded`` (nothing ran: the plan of its shards, for ``run_shards``)."""

    kind: Literal["ran", "sharded"]
    report: TickReport | None = None
    board: Board | None = None
    plan: ShardPlan | None = None

    @classmethod
    def of_report(cls, report: TickReport, board: Board | None) -> TickResult:
        return cls("ran", report=report, board=board)

    def ran(self) -> tuple[TickReport, Board | None]:
        """The report and board of a tick that ran."""
        assert self.report is not None, f"a {self.kind} tick has no report"
        return self.report, self.board

    def sharded(self) -> ShardPlan:
        """The shards of a tick that runs none of its subjects itself."""
        assert self.plan is not None, f"a {self.kind} tick has no shards"
        return self.plan


def run_ledgered_tick(job: Job, period: Period, identities: dict[str, RunIdentity],
                      settings: RunledgerSettings, flow_run_id: str,
                      stop: Stop, expected_start: datetime | None = None,
                      shard_size: int | None = None, batch: bool = False) -> TickResult:
    """The tick's blocking part, in a thread of its own: ledger, model and stage task runs,
    then the count of its Runs asked for again and the job's status board as the tick left it
    (None if it could not be read). A tick of
    no explicit period, expected at ``expected_start``, that starts too late may be skipped by
    its job's missed-run policy (``stale_reason``). With more than ``shard_size`` subjects to
    run, it runs none: it comes to their shards, for ``run_shards``. A ``batch`` tick submits
    the calls its subjects queued once they have ended (``submit_tick_batches``)."""
    with ledgered(job, period, settings, flow_run_id, stop, batch=batch) as tick:
        stale = (None if expected_start is None
                 else stale_reason(job, period, expected_start,
                                   retried(tick.ledger.now, settings.task_retries,
                                           settings.retry_delay_seconds)))
        if stale is not None:
            report = skip_tick(tick, identities, stale)
            return TickResult.of_report(report, after_tick(tick.ledger, job, report))
        outcomes, to_run = read_finished(tick, identities)
        if shard_size is not None and len(to_run) > shard_size:
            return TickResult("sharded",
                              plan=ShardPlan(list(identities), outcomes, split(to_run, shard_size)))
        report = run_tick(tick, identities, outcomes, to_run)
        if tick.batch is not None:
            report.batches = submit_tick_batches(tick, tick.ledger.now())
        return TickResult.of_report(report, after_tick(tick.ledger, job, report))


def batch_deadline(job: Job, period: Period, settings: RunledgerSettings,
                   now: datetime) -> datetime:
    """Until when a tick's calls may wait for batches: its due time, or ``now`` when the tick
    runs late (a backfill, a missed run), plus ``RUNLEDGER_BATCH_DEADLINE_SECONDS``."""
    return max(job.due_at(period), now) + timedelta(seconds=settings.batch_deadline_seconds)


def submit_tick_batches(tick: Tick, now: datetime) -> list[Submitted]:
    """Submit the calls the tick's subjects queued (and any its job's endpoint still has
    queued from before), as batches of the provider's size; each names this tick and its
    deadline (``batch_deadline``)."""
    assert tick.batch_client is not None and tick.batch is not None  # a batch tick's
    try:
        return submit_queued(
            tick.ledger, tick.batch_client, job=tick.job.name, endpoint=tick.batch.endpoint,
            model=tick.model.name, owner=tick.owner("submit"),
            lease_seconds=tick.settings.batch_lease_seconds, flow_run_id=tick.flow_run_id,
            period_start=tick.period.start,
            deadline_at=batch_deadline(tick.job, tick.period, tick.settings, now),
            max_tokens=tick.batch.queue_tokens)
    except CreateInDoubt as exc:
        log.info("job %s: %s", tick.job.name, exc)
        return []
    except RunledgerError as exc:
        # The calls are queued in the ledger: the next poll submits them once this lease ends.
        log.warning("job %s: could not submit its batch now (%s); `runledger batches poll` "
                    "submits it after %g s", tick.job.name, exc,
                    tick.settings.batch_lease_seconds)
        return []


def finish_sharded_tick(job: Job, period: Period, settings: RunledgerSettings,
                        flow_run_id: str, stop: Stop, plan: ShardPlan,
                        flow_runs: list[FlowRun]) -> TickResult:
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
        return TickResult.of_report(report, after_tick(tick.ledger, job, own))


@contextmanager
def ledgered(job: Job, period: Period, settings: RunledgerSettings, flow_run_id: str,
             stop: Stop, revising: Revising | None = None, batch: bool = False
             ) -> Iterator[Tick]:
    """A Tick with its own ledger connection and model client, closed when it ends, inside one
    sync Prefect client for all its task runs: a sync task run inside an async flow run
    otherwise opens a client of its own (about 20 ms of TLS set-up each). A ``batch`` tick
    queues its calls for the endpoint's Batch API, priced and budgeted at the batch price,
    outside the endpoint's synchronous limits."""
    with SyncClientContext.get_or_create():
        endpoint = endpoint_named(job.endpoint, settings)  # unknown: refused, nothing written
        ledger = Ledger.connect()
        model = endpoint.model()
        batch_client = endpoint.batch_client() if batch else None
        try:
            prices = endpoint.prices()
            if batch_client is not None:
                prices = prices.batched()
            if job.budget is not None:  # before any Run is claimed: nothing is written
                job.budget.check_prices(job.name, model.name, prices)
            # The database clock, read only for a budget, and retried like the tick's first
            # read: a tick may start while the ledger's server restarts.
            spend = None if job.budget is None else estimator(
                job.name, job.budget, prices, period,
                retried(ledger.now, settings.task_retries, settings.retry_delay_seconds))
            limits = None if batch_client is not None else endpoint.limits
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
                       endpoint_concurrency=None if limits is None else limits.max_concurrent,
                       batch=None if batch_client is None
                       else BatchQueue(endpoint.name, batch_client.line, flow_run_id,
                                       endpoint.batch_queue_tokens),
                       batch_client=batch_client)
        finally:
            if batch_client is not None:
                batch_client.close()
            model.close()
            ledger.close()
