"""What happened to each subject of a tick, as people read it: Prefect state names, events,
the per-flow-run artifact and the flow run's final state."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from prefect import State
from prefect.events import emit_event
from prefect.events.worker import EventsWorker, should_emit_events
from prefect.results import ResultRecord  # type: ignore[attr-defined]  # re-exported there
from prefect.states import Cancelled, Completed, Failed, Paused

from flows.batches.submit import Submitted
from flows.budgeting import OVER_BUDGET_STATE
from flows.events import run_resource
from flows.model import CallCount
from flows.prices import money
from flows.run_job.stages import AWAITING_BATCH_STATE
from flows.run_job.stop import Stop
from flows.spend import Spend, cost_text, spend_of
from store import OutputPruned, Period

# "stopped": the flow run was cancelled or timed out before the subject's next stage and its Run
# was released; an event of its own, so that alerts on failures do not fire for a cancel.
# "skipped": a scheduled flow run that started later than the job allows, whose missed-run
# policy says not to run it (the occurrence is recorded skipped).
# "over-budget": the job's budget had no room for the subject's next model call; no call was
# made, its Run is pending again and owed (reconcile runs it once the window resets or the cap
# is raised); not a failure of the Run, and not retried by Prefect.
# "waiting": a batch tick queued the subject's model call for its provider's Batch API; its Run
# waits for the batch without a lease (``runledger batches poll`` settles it and finishes the Run).
Outcome = Literal["new", "duplicate", "in-progress-elsewhere", "lease-lost", "stopped", "skipped",
                  "over-budget", "waiting", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("new", "duplicate", "in-progress-elsewhere", "lease-lost",
                                 "stopped", "skipped", "over-budget", "waiting", "failed")
EVENTS: dict[Outcome, str] = {
    "new": "runledger.run.completed",
    "duplicate": "runledger.run.duplicate",
    "in-progress-elsewhere": "runledger.run.in-progress-elsewhere",
    "lease-lost": "runledger.run.lease-lost",
    "stopped": "runledger.run.stopped",
    "skipped": "runledger.run.skipped",
    "over-budget": "runledger.run.over-budget",
    "waiting": "runledger.run.waiting",
    "failed": "runledger.run.failed",
}
NO_SUBJECTS = "NoSubjects"
# Prefect's UIs list a deployment's flow runs, and the Runs page, with the default filter "All
# except scheduled", which the V1 UI sends as a list of Prefect's own state names (V2, the
# default UI since Prefect 3.9, sends state types): a flow run in a state of any other name is
# hidden there. So a Completed flow run ends in one of Prefect's names, and the outcome's own
# name leads its state message. A duplicate is Prefect's "Cached": a stored result returned,
# nothing run again. OverBudget is the one exception (``over_budget_state``).
PREFECT_NAMES: dict[str, str] = {"Duplicate": "Cached"}
# The outcomes that name a tick's flow run when any subject has them, strongest first.
DECIDING: tuple[Outcome, ...] = ("failed", "stopped", "over-budget", "waiting", "lease-lost",
                                 "in-progress-elsewhere", "skipped")
STATE_NAMES: dict[Outcome, str] = {
    "new": "Completed",
    "duplicate": "Duplicate",
    "in-progress-elsewhere": "InProgressElsewhere",
    "lease-lost": "LeaseLost",
    "stopped": "Cancelled",
    "skipped": "Skipped",
    "over-budget": OVER_BUDGET_STATE,
    "waiting": AWAITING_BATCH_STATE,
    "failed": "Failed",
}


def listed_completed(name: str, message: str, data: Any) -> State[Any]:
    """A Completed state the UI's default filters list: Prefect's own name for ``name``
    (``Cached`` for a Duplicate, else ``Completed``), with ``name`` leading the message."""
    listed = PREFECT_NAMES.get(name, "Completed")
    return Completed(name=listed, data=data,
                     message=message if name == listed else f"{name}: {message}")


def over_budget_state(message: str, data: Any) -> State[Any]:
    """An over-budget flow run's state: Failed, named OverBudget, so that no UI paints money
    left unspent on owed Runs as a success (the runs list and the run page read "OverBudget" in
    red). Failed rather than Cancelled: Cancelled says a person stopped the run, runs no
    ``on_failure`` hook (the tick's artifacts are waited for in one) and is what a stopped
    tick is; a flow run with Prefect ``retries`` set runs again on Failed, which costs no model
    call (the budget refuses before a call leaves) and ends OverBudget again. Prefect's Runs
    filter "All except scheduled" of its V1 UI lists names, and hides this one; the V2 UI (the
    default) and every state-type filter list it."""
    return Failed(name=OVER_BUDGET_STATE, message=message, data=data)


def outcome_state(outcome: Outcome, name: str, message: str, data: Any) -> State[Any]:
    """A flow run's state for its deciding ``outcome``, named ``name`` when it is Completed:
    Failed for a failure, Cancelled for a stop, Failed named OverBudget for over-budget,
    Paused named AwaitingBatch while Runs wait for a batch (the settle-batches flow run that
    finishes them ends it)."""
    if outcome == "waiting":
        return Paused(name=AWAITING_BATCH_STATE, message=message, data=data)
    if outcome == "failed":
        return Failed(message=message, data=data)
    if outcome == "stopped":
        return Cancelled(message=message, data=data)
    if outcome == "over-budget":
        return over_budget_state(message, data)
    return listed_completed(name, message, data)


def state_value(state: State[Any]) -> Any:
    """The value a flow run in this process returned (its report, or the exception it
    raised), from its state's data, sync or async alike: ``State.result`` withholds a Paused
    run's (an AwaitingBatch tick) and, in async code, must be awaited."""
    data = state.data
    return data.result if isinstance(data, ResultRecord) else data


def outcome_name(state: State[Any]) -> str:
    """The outcome's own name of a flow run's final state (``Duplicate`` for a Cached one)."""
    if state.name in PREFECT_NAMES.values() or state.name == "Completed":
        head = (state.message or "").split(":", 1)[0]
        if head in (*STATE_NAMES.values(), NO_SUBJECTS, "Revised", "DryRun"):
            return head
    return state.name or ""


@dataclass(frozen=True)
class SubjectOutcome:
    """One subject's result in one tick: its Run, what happened, and what was queued."""

    subject: str
    run_id: str
    outcome: Outcome
    attempts: int = 0
    outbox_rows: int = 0
    error: str | None = None
    output: dict[str, Any] | None = field(default=None, repr=False)
    # A duplicate whose Run is a tombstone: when its output was pruned, and its digest.
    pruned: str | None = None
    # What this attempt's transform did with the model, and the prices' currency.
    spend: CallCount | None = field(default=None, repr=False)
    currency: str | None = None
    # A completed Run's model calls over all its attempts, from the ledger (``with_run_spend``).
    run_spend: Spend | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        found = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.name not in ("spend", "run_spend")}
        return {**found, **self.spend_fields(), **self.run_spend_fields()}

    def run_spend_fields(self) -> dict[str, Any]:
        """The Run's model calls over every attempt (paid, lost, reused, tokens, cost per
        currency), under ``run_spend``: None but for a Run this attempt completed."""
        return {"run_spend": None if self.run_spend is None else self.run_spend.as_dict()}

    def attempt_spend(self) -> Spend:
        """This attempt's model calls added up as ``costs`` adds them (``flows.spend``): a
        call the provider refused is not paid; answers replayed from a checkpoint counted."""
        spent = self.spend or CallCount()
        total = spend_of(spent.records)
        total.reused = spent.reused
        return total

    def spend_fields(self) -> dict[str, Any]:
        """This attempt's model calls: those that left (``model_calls``), paid, refused by the
        provider (not paid), reused from a checkpoint, tokens, cost (a decimal string in
        ``currency``; None when no call had a price)."""
        spent = self.spend or CallCount()
        calls = self.attempt_spend()
        priced = bool(self.currency) and spent.made > spent.unpriced
        return {"model_calls": spent.made, "calls_paid": calls.paid,
                "calls_refused": calls.refused, "calls_reused": spent.reused,
                "tokens": spent.tokens,
                "cost": str(money(spent.cost_nanos)) if priced else None,
                "currency": self.currency if priced else None}

    def cost_text(self) -> str:
        """This attempt's model cost for people: ``-`` without calls."""
        spent = self.spend
        if spent is None or not (spent.made or spent.reused):
            return "-"
        cost = {self.currency: spent.cost_nanos} if self.currency and spent.cost_nanos else {}
        return cost_text(cost, spent.unpriced)

    def require_output(self) -> dict[str, Any]:
        """The Run's output, for a caller that needs it; ``OutputPruned`` when retention
        pruned it (nothing is recomputed), ``LookupError`` when the subject has none."""
        if self.pruned is not None:
            raise OutputPruned(f"run {self.run_id} ({self.subject}) is completed but its output "
                               f"was pruned: {self.pruned}; nothing was recomputed. Request a "
                               "revision to compute it anew")
        if self.output is None:
            raise LookupError(f"run {self.run_id} ({self.subject}) has no output: "
                              f"{self.outcome}{f' ({self.error})' if self.error else ''}")
        return self.output


class TickReport:
    """Every subject's outcome for one job and period.

    A plain class, not a dataclass: Prefect walks whatever a flow returns (dataclasses field
    by field, every list and dict) looking for futures to resolve, and a report holds every
    subject's output; it leaves other objects alone."""

    __slots__ = ("batches", "job", "period", "subjects", "version")

    def __init__(self, job: str, version: str, period: Period,
                 subjects: list[SubjectOutcome]) -> None:
        self.job = job
        self.version = version
        self.period = period
        self.subjects = subjects
        self.batches: list[Submitted] = []  # the batches a batch tick submitted

    def __repr__(self) -> str:
        return f"TickReport({self.summary()!r})"

    @property
    def name(self) -> str:
        return f"{self.job}/{self.period.label}"

    def counts(self) -> Counter[Outcome]:
        return Counter(s.outcome for s in self.subjects)

    def summary(self) -> str:
        counts = self.counts()
        parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts[o]]
        return f"{self.name}: {', '.join(parts) or 'no subjects'}"

    def deciding_outcome(self) -> Outcome:
        """Failed beats everything; then a stop; then the outcome that says the tick is not ours
        to finish; Duplicate only when every subject was already completed."""
        counts = self.counts()
        for outcome in DECIDING:
            if counts[outcome]:
                return outcome
        if self.subjects and counts["duplicate"] == len(self.subjects):
            return "duplicate"
        return "new"

    def state_name(self) -> str:
        return STATE_NAMES[self.deciding_outcome()] if self.subjects else NO_SUBJECTS

    def completed_every_subject(self) -> bool:
        """Every subject of the tick has a completed Run (new now, or before)."""
        return bool(self.subjects) and all(s.outcome in ("new", "duplicate")
                                           for s in self.subjects)

    def final_state(self) -> State[Any]:
        """The flow run's state; its message names the subjects behind it (up to five) and
        why: the error, or who holds the lease and until when."""
        outcome = self.deciding_outcome()
        message = self.summary()
        if not self.subjects:  # a job that lists nobody owes nothing: not a healthy tick
            return listed_completed(NO_SUBJECTS, (
                f"{self.name}: the job listed no subjects, so nothing ran; check where its "
                "subjects come from"), self)
        behind = [s for s in self.subjects if s.outcome == outcome and s.error]
        if outcome == "over-budget" and behind:
            # Short, for the runs list: the counts, then one refusal (what was spent of which
            # cap, and the remedy); every subject's is in the tick's artifact.
            refusal = behind[0].error or ""
            message += f". {refusal[:1].upper()}{refusal[1:]}"
        elif outcome == "waiting":
            message += f"; {self.batches_text()}"
        elif outcome in DECIDING and behind:
            message += f" ({'; '.join(f'{s.subject}: {s.error}' for s in behind[:5])})"
        pruned = [s for s in self.subjects if s.pruned]
        if pruned:  # a rerun that finds tombstones says so, instead of recomputing
            message += (f" (output pruned, not recomputed: "
                        f"{'; '.join(f'{s.subject}: {s.pruned}' for s in pruned[:5])})")
        return outcome_state(outcome, STATE_NAMES[outcome], message, self)

    def batches_text(self) -> str:
        """The batches this tick submitted, for its state and artifact."""
        if not self.batches:
            return ("queued for the next batch (`runledger batches poll` submits what a tick "
                    "could not)")
        return "waiting on " + ", ".join(
            f"batch {b.key} ({b.provider_batch_id}, {b.requests} requests)"
            for b in self.batches[:5]) + (" ..." if len(self.batches) > 5 else "")

    def markdown(self) -> str:
        lines = [
            f"# {self.name}",
            "",
            f"Job `{self.job}` version `{self.version}`, period "
            f"`{self.period.start.isoformat()}` to `{self.period.end.isoformat()}` "
            f"({self.period.timezone}).",
            "",
            f"**{self.summary()}**",
            "",
            f"Model: {self.spend_summary()}.",
            "",
            *([f"Batch: {self.batches_text()}.", ""] if self.counts()["waiting"] else []),
            "| subject | Run id | outcome | attempts | outbox rows queued | calls paid "
            "(reused) | tokens | cost | error |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for s in self.subjects:
            error = (s.error or (f"output pruned: {s.pruned}" if s.pruned else "")
                     ).replace("|", "\\|").replace("\n", " ")
            spent = s.spend_fields()
            lines.append(f"| {s.subject} | `{s.run_id}` | {s.outcome} | {s.attempts} | "
                         f"{s.outbox_rows} | {spent['calls_paid']} ({spent['calls_reused']}) | "
                         f"{spent['tokens']} | {s.cost_text()} | {error} |")
        return "\n".join(lines) + "\n"

    def spend_summary(self) -> str:
        """The tick's model calls added up as ``costs`` adds them: paid (answered, failed,
        lost), refused by the provider (not paid), in flight, reused, tokens and cost."""
        total = Spend()
        for s in self.subjects:
            if s.spend is not None:
                for record in s.spend.records:
                    total.add(record)
                total.reused += s.spend.reused
        apart = [f"{n} {what}" for n, what in ((total.refused, "refused (not paid)"),
                                               (total.in_flight, "in flight")) if n]
        return (f"{total.paid} calls paid{''.join(f', {a}' for a in apart)}, {total.reused} "
                f"answers reused from a checkpoint, {total.tokens} tokens, "
                f"{total.money() if total.paid else '-'}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job, "version": self.version, "period": self.period.label,
            "period_start": self.period.start.isoformat(),
            "period_end": self.period.end.isoformat(), "state": self.state_name(),
            "summary": self.summary(), "spend": self.spend_summary(),
            "batches": [{"key": b.key, "provider_batch_id": b.provider_batch_id,
                         "status": b.status, "requests": b.requests} for b in self.batches],
            "subjects": [s.as_dict() for s in self.subjects],
        }


pipeline_log = logging.getLogger("runledger.pipeline")
# Events this process may hold unsent before a tick starts its next subject: about 100 subjects'
# (each subject's task runs send nine state events, and its outcome one).
EVENT_BACKLOG_LIMIT = 1_000
EVENT_STALL_SECONDS = 30.0  # sending nothing that long, Prefect's events worker is not waited for
_POLL_SECONDS = 0.05


def unsent_events() -> int:
    """How many events this process's Prefect events worker holds unsent (0 when events are
    off). Prefect's queue of them is unbounded, and each keeps the context it was emitted in
    (its task run's, with the task's parameters) until sent."""
    if not should_emit_events():
        return 0
    return EventsWorker.instance()._queue.qsize()  # no public accessor


class EventBacklog:
    """Holds a tick's next subject back while more than ``limit`` events wait to be sent and
    they are being sent: a tick makes events faster than a busy Prefect server takes them, and
    without this its process would hold every subject's events (and their task runs' contexts)
    at once, hundreds of megabytes at 10,000 subjects, and send them after the flow run ended.
    While nothing was sent for ``stall_seconds`` (the server away), the tick does not wait."""

    def __init__(self, limit: int | None = None, stall_seconds: float = EVENT_STALL_SECONDS,
                 unsent: Callable[[], int] = unsent_events) -> None:
        self.limit = EVENT_BACKLOG_LIMIT if limit is None else limit
        self.stall_seconds = stall_seconds
        self.unsent = unsent
        self.waited = 0.0  # seconds subjects spent waiting, all threads together
        self._sent_at = time.monotonic()  # when a waiter last saw the backlog shrink
        self._last = 0  # the last count of unsent events a waiter saw
        self._warned = False
        self._lock = threading.Lock()

    def stalled(self) -> bool:
        return time.monotonic() - self._sent_at > self.stall_seconds

    def _seen(self, unsent: int) -> None:
        """Record a count of unsent events; a smaller one than the last means events went."""
        with self._lock:
            if unsent < self._last or unsent <= self.limit:
                self._sent_at = time.monotonic()
            self._last = unsent

    def wait(self, stop: Stop) -> None:
        """Return once at most ``limit`` events wait, the worker stalled, or ``stop`` is set."""
        self._seen(unsent := self.unsent())
        if unsent <= self.limit:
            return
        began = time.monotonic()
        while unsent > self.limit and not self.stalled() and not stop.is_set():
            time.sleep(_POLL_SECONDS)
            self._seen(unsent := self.unsent())
        with self._lock:
            self.waited += time.monotonic() - began
            warn = unsent > self.limit and self.stalled() and not self._warned
            self._warned = self._warned or warn
        if warn:
            pipeline_log.warning(
                "Prefect's events worker sent none of its %d unsent events for %.0f s; the "
                "tick goes on without waiting for it until it sends again", unsent,
                self.stall_seconds)


def emit_outcome(job: str, version: str, period: Period, outcome: SubjectOutcome) -> None:
    """A Prefect event for a ledger transition (or a refusal), with the Run as the resource."""
    emit_event(
        event=EVENTS[outcome.outcome],
        resource=run_resource(job, version, outcome.subject, period, outcome.run_id),
        payload={"attempts": outcome.attempts, "outbox_rows": outcome.outbox_rows,
                 "error": outcome.error, **outcome.spend_fields(),
                 **outcome.run_spend_fields(),
                 **({"output_pruned": outcome.pruned} if outcome.pruned else {})},
    )
