"""A tick too large for one flow run, spread over its deployment's work pool: the subjects not
yet finished are split into shards, each a flow run of the same deployment (a subflow of the
tick, taken by any worker of the pool on any host), and the tick waits for them. The ledger
makes this safe as it makes retries safe: a shard retried, run twice or killed completes each
Run once. What each subject came to is read back from the ledger, which outlives any shard.

A shard is told it is one by the idempotency key its tick creates it with (``shard_key``), not
by a parameter: the flow's parameters are what a person sets in the Prefect UI, and a copy of a
shard's parameters run by hand is a plain tick of its subjects."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil
from typing import Any
from uuid import UUID

from prefect import State
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment

from flows.budgeting import OVER_BUDGET_STATE
from flows.jobs import Job
from flows.model import CallCount
from flows.run_job.findings import duplicate_outcome, failed_permanently
from flows.run_job.outcomes import Outcome, SubjectOutcome
from flows.run_job.tick import Tick
from flows.spend import spend_of
from store import InvalidInput, ModelCall, Period, Run, RunIdentity

# How often the tick asks the Prefect server whether its shards have ended.
POLL_SECONDS = 2.0
_SHARD_LABEL = re.compile(r"^([1-9][0-9]*)/([1-9][0-9]*)$")
# What ends a shard's idempotency key, before its label: "<tick flow run>:<try>:shard-2/4".
_SHARD_KEY_MARK = ":shard-"


class InvalidSharding(InvalidInput):
    """A run-job flow run's ``shard_size`` parameter or its shard label is invalid."""


def shard_size_for(job: Job, given: Any) -> int | None:
    """The subjects a shard of ``job``'s tick holds at most: the flow run's ``shard_size``
    parameter, else the job's; None: the tick runs in one flow run."""
    if given is None:
        return job.shard_size
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise InvalidSharding(
            f"shard_size must be a whole number of subjects, 1 or more, got {given!r}; leave "
            f"it empty for the job's own ({job.shard_size or 'none: one flow run'})")
    return given


def shard_label_of(idempotency_key: str | None) -> str | None:
    """The shard label ("2/4") a sharded tick put in its shard's idempotency key
    (``shard_key``); None for a flow run that is not a shard (a tick)."""
    if idempotency_key is None or _SHARD_KEY_MARK not in idempotency_key:
        return None
    label = idempotency_key.rsplit(_SHARD_KEY_MARK, 1)[1]
    found = _SHARD_LABEL.match(label)
    if found is None or int(found[1]) > int(found[2]):
        raise InvalidSharding(f"shard must be N/M (shard N of M), got {label!r}; a sharded "
                              "tick gives it to its shards in their idempotency key "
                              f"(...{_SHARD_KEY_MARK}N/M)")
    return found[0]


def current_shard() -> str | None:
    """This flow run's shard label ("2/4"), from its idempotency key; None for a tick (a flow
    run of no key, or of another key: a schedule's, a person's)."""
    context = FlowRunContext.get()
    flow_run = None if context is None else context.flow_run
    return shard_label_of(None if flow_run is None else flow_run.idempotency_key)


def shard_key(tick_key: str, label: str) -> str:
    """The idempotency key of shard ``label`` of the tick's try ``tick_key``: it makes the
    shard's creation idempotent and tells the shard which one it is (``shard_label_of``)."""
    return f"{tick_key}{_SHARD_KEY_MARK}{label}"


@dataclass(frozen=True)
class Shard:
    """One shard of a tick: its number, how many there are, and its subjects' identities."""

    number: int
    of: int
    identities: dict[str, RunIdentity]

    @property
    def label(self) -> str:
        return f"{self.number}/{self.of}"

    def flow_run_name(self, job: str, period: Period) -> str:
        return f"{job}/{period.label}/shard-{self.number}-of-{self.of}"


@dataclass(frozen=True)
class ShardPlan:
    """A tick to be run as shards: its subjects in order, the outcomes of those already
    finished, and the shards of the others."""

    subjects: list[str]
    finished: dict[str, SubjectOutcome]
    shards: list[Shard]


def split(pending: dict[str, RunIdentity], size: int) -> list[Shard]:
    """The fewest shards of at most ``size`` subjects, their sizes as even as can be, the
    subjects in the tick's order."""
    count = ceil(len(pending) / size)
    items = list(pending.items())
    shards, start = [], 0
    for number in range(1, count + 1):
        end = start + len(items) // count + (number <= len(items) % count)
        shards.append(Shard(number, count, dict(items[start:end])))
        start = end
    return shards


async def run_shards(deployment_id: str, job: Job, period: Period, shards: Sequence[Shard],
                     allow_not_due: bool, key: str) -> list[FlowRun]:
    """Start every shard as a subflow run of deployment ``deployment_id`` and wait for all of
    them to end; ``key`` (the tick's flow run and try) makes each one's creation idempotent."""
    async def one(shard: Shard) -> FlowRun:
        # Any period string names the period containing it: the start, with its offset.
        parameters = {"job": job.name, "subjects": list(shard.identities),
                      "period": period.start.isoformat(), "allow_not_due": allow_not_due}
        found: FlowRun = await run_deployment(  # type: ignore[misc]  # the async dispatch
            UUID(deployment_id), parameters=parameters,
            flow_run_name=shard.flow_run_name(job.name, period),
            idempotency_key=shard_key(key, shard.label), timeout=None,
            poll_interval=POLL_SECONDS, as_subflow=True)
        return found

    return list(await asyncio.gather(*(one(s) for s in shards)))


def shard_outcomes(tick: Tick, runs: dict[str, Run], calls: dict[str, list[ModelCall]],
                   shards: Sequence[Shard], flow_runs: Sequence[FlowRun]
                   ) -> dict[str, SubjectOutcome]:
    """Each shard subject's outcome, from its Run as the ledger holds it once its shard ended:
    completed by a shard of this tick (new) or before (duplicate), failed, or left unfinished
    (by a shard that crashed, was cancelled or failed, or to another holder). Not emitted: the
    shard emitted its own."""
    ours = {str(f.id) for f in flow_runs}
    outcomes: dict[str, SubjectOutcome] = {}
    for shard, flow_run in zip(shards, flow_runs, strict=True):
        for subject, identity in shard.identities.items():
            run = runs.get(identity.run_id)
            outcomes[subject] = (
                _unstarted(subject, identity, flow_run) if run is None
                else _ended(tick, subject, run, calls.get(run.run_id, []), ours, flow_run))
    return outcomes


def _ended(tick: Tick, subject: str, run: Run, calls: list[ModelCall], ours: set[str],
           flow_run: FlowRun) -> SubjectOutcome:
    if run.status == "completed" and run.completed_flow_run_id in ours:
        assert run.output is not None  # a completed Run has its output until pruned
        rows = len({(m.channel, m.recipient) for m in tick.messages(subject, run.output)})
        records = [c.model_dump() for c in calls]
        return SubjectOutcome(
            subject, run.run_id, "new", run.attempts, rows, output=run.output,
            spend=_attempt_count([r for r in records
                                  if r["attempt_id"] == run.completed_attempt_id]),
            currency=tick.prices.currency, run_spend=spend_of(records))
    if run.status == "completed":
        return duplicate_outcome(subject, run)
    if run.status == "failed":
        return failed_permanently(subject, run)
    state = flow_run.state
    name = state.name if state is not None else "unknown"
    if run.status == "pending" and ended_over_budget(state):
        # The shard's deciding outcome was over-budget, and this Run is one it released.
        return SubjectOutcome(subject, run.run_id, "over-budget", run.attempts,
                              error=run.error or f"left pending by its shard {flow_run.name}")
    if state is None or not state.is_completed():
        outcome: Outcome = ("stopped" if state is not None and state.is_cancelled()
                            else "failed")
        return SubjectOutcome(
            subject, run.run_id, outcome, run.attempts,
            error=f"its shard {flow_run.name} ended {name}"
                  f"{f' ({state.message})' if state is not None and state.message else ''}; "
                  f"the Run is {run.status} ({run.error or 'no error recorded'}): a retry of "
                  "this flow run or reconcile runs it")
    if run.status == "running":
        until = run.lease_expires_at.isoformat(timespec="seconds") if run.lease_expires_at \
            else "?"
        return SubjectOutcome(subject, run.run_id, "in-progress-elsewhere", run.attempts,
                              error=f"leased by {run.owner} until {until}")
    return SubjectOutcome(subject, run.run_id, "failed", run.attempts,
                          error=run.error or f"left pending by its shard {flow_run.name}")


def ended_over_budget(state: State[Any] | None) -> bool:
    """A shard that ended over-budget: its state's type and name, never its message."""
    return state is not None and state.is_failed() and state.name == OVER_BUDGET_STATE


def _unstarted(subject: str, identity: RunIdentity, flow_run: FlowRun) -> SubjectOutcome:
    """A subject whose shard ended before registering its Run (it crashed first)."""
    state = flow_run.state
    return SubjectOutcome(subject, identity.run_id, "failed",
                          error=f"its shard {flow_run.name} ended "
                                f"{state.name if state else 'unknown'} before it registered "
                                "the Run: a retry of this flow run or reconcile runs it")


def _attempt_count(records: list[dict[str, Any]]) -> CallCount:
    """What one attempt's transform did with the model, from its call records."""
    spent = spend_of(records)
    return CallCount(made=spent.paid + spent.in_flight, reused=spent.reused,
                     tokens=spent.tokens, cost_nanos=sum(spent.cost.values()),
                     unpriced=spent.unpriced + spent.unknown,
                     call_ids=[r["call_id"] for r in records], records=records)
