"""A tick's subjects taken through the stages: a batch at a time registered and claimed, the
claimed ones run with bounded concurrency while one lease keeper renews their leases, and every
way out of a subject (completed, lease lost, over budget, failed, stopped) made its
SubjectOutcome."""

from __future__ import annotations

import contextvars
import functools
import logging
import queue
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from prefect.context import FlowRunContext
from prefect.utilities.annotations import quote

from flows.budgeting import exhausted_payload, refusal_text
from flows.errors import LeaseLapsed, is_transient
from flows.events import emit_job_event
from flows.model import QueuedForBatch
from flows.run_job.findings import describe, lapsed_outcome, lease_lost_outcome, unclaimed_outcome
from flows.run_job.lease_keeper import LeaseKeeper
from flows.run_job.outcomes import Outcome, SubjectOutcome, TickReport
from flows.run_job.stages import retried, stage_value
from flows.run_job.stop import FlowRunStopped, stopped_before
from flows.run_job.tasks import Stages, configured_stages
from flows.run_job.tick import Held, Persisted, Tick
from flows.spend import Spend, spend_of
from store import BudgetExhausted, Claim, LeaseLost, Registration, Run, RunIdentity, RunledgerError

log = logging.getLogger(__name__)


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
    except QueuedForBatch as exc:
        return _wait_for_batch(tick, claim, subject, exc, hold)
    except Exception as exc:
        return _spent(_fail(tick, claim, subject, exc, hold.calls.made), tick, hold)
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


def _wait_for_batch(tick: Tick, claim: Claim, subject: str, queued: QueuedForBatch,
                    hold: Held) -> SubjectOutcome:
    """A model call of the subject's Run was queued for a batch: its Run waits for the batch
    without a lease, its attempt given back; the tick's batch is submitted when its subjects
    have ended."""
    try:
        tick.ledger.batches.wait_for_batch(claim, str(queued))
    except LeaseLost as lost:
        return lease_lost_outcome(tick, subject, claim.run_id, lost)
    return _spent(SubjectOutcome(subject, claim.run_id, "waiting", error=str(queued)), tick,
                  hold)


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
