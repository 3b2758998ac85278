"""How a stage task meets Prefect: its options (no cache, no persisted result, retries for
transient failures only), the state a stale attempt returns, and how its caller reads the value
a stage returned."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from prefect import State
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.results import ResultRecord  # type: ignore[attr-defined]  # re-exported there
from prefect.states import Completed
from prefect.tasks import Task, exponential_backoff
from prefect.utilities.math import clamped_poisson_interval

from flows.errors import is_transient
from flows.model import EndpointRefusing, QueuedForBatch
from flows.run_job.lease_keeper import LeaseKeeper
from flows.run_job.stop import FlowRunStopped
from store import BudgetExhausted, Claim, LeaseLost

RETRY_JITTER_FACTOR = 0.5
STAGE_OPTIONS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}
AWAITING_BATCH_STATE = "AwaitingBatch"
T = TypeVar("T")


def with_retries(stage: Task[..., Any], retries: int, delay_seconds: float) -> Task[..., Any]:
    """``stage`` retried with exponential backoff and jitter, for transient failures only."""
    return stage.with_options(
        retries=retries,
        retry_delay_seconds=exponential_backoff(delay_seconds),
        retry_jitter_factor=RETRY_JITTER_FACTOR,
        retry_condition_fn=_retry_if_transient,
    )


def _retry_if_transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    # An endpoint that kept refusing was waited out in-process already (reconcile comes back);
    # a stopped flow run's subject is released, not retried.
    return isinstance(state.data, BaseException) and is_transient(state.data) \
        and not isinstance(state.data, EndpointRefusing | FlowRunStopped)


def retried(call: Callable[[], T], retries: int, delay_seconds: float) -> T:
    """``call()`` outside a task run, retried on transient failures with a stage's delays
    (exponential backoff, the same jitter): a ledger read of the tick itself."""
    for delay in [*exponential_backoff(delay_seconds)(retries), None]:
        try:
            return call()
        except Exception as exc:
            if delay is None or not is_transient(exc):
                raise
            time.sleep(clamped_poisson_interval(delay, RETRY_JITTER_FACTOR))
    raise AssertionError("unreachable: the last try returns or raises")


def lost_state(keeper: LeaseKeeper, claim: Claim, consequence: str = "") -> State[Any] | None:
    """A LeaseLost state when the keeper found the claim's fence moved on or its lease lapsed,
    else None."""
    lost = keeper.lost(claim)
    if lost is None:
        return None
    return lease_lost_state(type(lost)(f"{consequence}{lost}"))


def lease_lost_state(error: LeaseLost, consequence: str = "") -> State[Any]:
    """A Completed state named LeaseLost: the UI shows a stale attempt, not a crash."""
    return Completed(name="LeaseLost", message=f"{consequence}{error}", data=error)


def stage_value(returned: Any) -> Any:
    """A stage's value. A stage that returned a named state hands back that state, whose data
    is in memory (results are not persisted); a lost lease is raised as LeaseLost, a budget's
    refusal as BudgetExhausted, a call queued for a batch as QueuedForBatch."""
    if isinstance(returned, State):
        data = returned.data
        returned = data.result if isinstance(data, ResultRecord) else data
    if isinstance(returned, LeaseLost | BudgetExhausted | QueuedForBatch):
        raise returned
    return returned
