"""A model call's plan: what a call carries (``Intent``, then ``InFlight``; how it ended,
``End``) and the steps its operations take beside its own record, in the same transaction,
chosen from what it carries: a budget ``charge`` reserves its estimate before the call is
recorded and settles to the real cost when it ends (``Reserve``); an endpoint ``slot`` whose
endpoint bounds its calls in flight is taken in the transaction that records the call
(``TakeSlot``; any other slot was taken before, in a statement of its own, and is carried).
A call that carries nothing is recorded, and ended, in one statement.

A call ``queued`` for a provider's batch takes the same steps, but no slot: its reservation
is settled when its batch's results come in (``settle_end``, by ``store.batches``).

Adding a step: give ``Intent`` and ``InFlight`` the field that carries it, write one ``Step``
subclass with the hooks it needs (``before_intent``, ``after_end``; a hook that writes sets its
``writes_*`` flag, so that the operation is no longer sent as one statement) and add it in
``steps``. The operations of ``store.model_calls`` do not change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any, ClassVar

from sqlalchemy.engine import Connection

from store import budgets
from store.endpoint_limits import Slot, SlotDecision, take_slot_with_record
from store.errors import InvalidInput
from store.lease import Claim

MAX_NAME = 300
DIGEST_CHARS = 64
MAX_CUSTOM_ID = 64
CALL_FAILURES = ("refused", "failed")
# A queued call its batch ended without, taken out of batch mode to be called synchronously
# (its deadline near): never paid, its reservation released.
WITHDRAWN = "withdrawn"


def _check_count(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name} must be an integer of 0 or more (or None), got {value!r}")
    return value


def _check_name(value: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME:
        raise InvalidInput(f"{name} must be non-empty text of at most {MAX_NAME} characters, "
                           f"got {value!r}")
    return value


class Step:
    """One step a call's operations take beside its record, in the same transaction; a hook
    a step does not override writes nothing."""

    writes_at_intent: ClassVar[bool] = False
    writes_at_end: ClassVar[bool] = False

    def before_intent(self, conn: Connection) -> SlotDecision | None:
        """Before the call is recorded: None to go on, or the decision that stops it (what
        the step wrote is committed, the call is not recorded)."""
        return None

    def after_end(self, conn: Connection, end: End) -> None:
        """After the call's end is recorded, by the record that ended it (once)."""


@dataclass(frozen=True)
class TakeSlot(Step):
    """Take the call's slot of an endpoint that bounds its calls in flight in the transaction
    that records it: the next asking counts this call in flight."""

    slot: Slot
    writes_at_intent: ClassVar[bool] = True

    def before_intent(self, conn: Connection) -> SlotDecision | None:
        decision = take_slot_with_record(conn, self.slot)
        return None if decision.granted else decision


@dataclass(frozen=True)
class Reserve(Step):
    """Reserve the call's estimate in its job's budget windows before it is recorded
    (``BudgetExhausted`` rolls back both), and settle it when the call ends: an answer to its
    real cost (money, or tokens; its estimate, the most it could cost, when the provider
    reported no usage or no price), a refusal or failure to nothing."""

    charge: budgets.Charge
    writes_at_intent: ClassVar[bool] = True
    writes_at_end: ClassVar[bool] = True

    def before_intent(self, conn: Connection) -> SlotDecision | None:
        budgets.reserve(conn, self.charge)
        return None

    def after_end(self, conn: Connection, end: End) -> None:
        charge = self.charge
        settle_end(conn, charge.job, charge.unit, charge.estimate,
                   [(window.scope, window.start) for window in charge.windows], end)


def settle_end(conn: Connection, job: str, unit: str, estimate: int,
               windows: Sequence[tuple[str, datetime]], end: End) -> None:
    """Settle a call's reservation of ``estimate`` in each of its job's ``windows`` (scope,
    start) by how it ended: an answer to its real cost in the budget's ``unit`` (money, or
    tokens; its estimate, the most it could cost, when the provider reported no usage or no
    price), a refusal or failure to nothing. The one rule of a call sent (``Reserve``) and of
    a call settled from its batch's results (``store.batches``)."""
    usage = end.usage
    spent: int | None = 0
    if end.outcome == "answered":
        reported = usage.prompt_tokens is not None and usage.completion_tokens is not None
        spent = usage.cost_nanos if unit == "money" else usage.tokens if reported else None
    for scope, start in windows:
        budgets.settle(conn, job, scope, start, estimate, estimate if spent is None else spent)


def reserved_windows(row: dict[str, Any]) -> list[tuple[str, datetime]]:
    """The budget windows (scope, start) a call's record says it reserved in."""
    found: list[tuple[str, datetime]] = []
    if row["budget_period"] is not None:
        found.append(("period", row["budget_period"]))
    if row["budget_day"] is not None:
        found.append(("day", _midnight(row["budget_day"])))
    return found


def steps(charge: budgets.Charge | None, slot: Slot | None) -> tuple[Step, ...]:
    """The steps of a call carrying ``charge`` and ``slot``, in the order they run."""
    planned: list[Step] = []
    if slot is not None and slot.bounds_in_flight:
        planned.append(TakeSlot(slot))
    if charge is not None:
        planned.append(Reserve(charge))
    return tuple(planned)


def charge_lost(conn: Connection, row: dict[str, Any]) -> None:
    """A call marked lost is charged its estimate in each budget window it reserved in (a
    call that left may have been billed): ``row`` is its record."""
    if not row["estimate"]:
        return
    for scope, start in reserved_windows(row):
        budgets.settle(conn, row["job"], scope, start, row["estimate"], row["estimate"])


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


@dataclass(frozen=True)
class Queued:
    """A call queued for a provider's batch instead of sent: the id of its line in the batch's
    file (``custom_id``), the request body the line sends (a JSON object), the flow run of
    the tick that queued it (None: none known) and its prompt's tokens, bounded from above
    (what it holds of the provider's enqueued-token limit; None: not counted)."""

    custom_id: str
    request: dict[str, Any]
    flow_run_id: str | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (not isinstance(self.custom_id, str) or not self.custom_id.strip()
                or len(self.custom_id) > MAX_CUSTOM_ID):
            raise InvalidInput(f"a queued call's custom_id is non-empty text of at most "
                               f"{MAX_CUSTOM_ID} characters, got {self.custom_id!r}")
        if not isinstance(self.request, dict):
            raise InvalidInput("a queued call's request is a JSON object, "
                               f"got {type(self.request).__name__}")
        _check_count(self.tokens, "a queued call's tokens")


@dataclass(frozen=True)
class Intent:
    """A call about to leave: the endpoint and model it goes to, its position in the transform
    (0 for the first call) and its prompt's sha256; what it carries decides its steps: a
    ``charge`` against the job's budget windows, a ``slot`` of its endpoint's limits. A call
    ``queued`` for a provider's batch is recorded queued, not in flight, and takes no slot."""

    endpoint: str
    model: str
    position: int
    prompt_digest: str
    charge: budgets.Charge | None = None
    slot: Slot | None = None
    queued: Queued | None = None

    def __post_init__(self) -> None:
        _check_name(self.endpoint, "a model call's endpoint")
        _check_name(self.model, "a model call's model")
        if _check_count(self.position, "a model call's position") is None:
            raise InvalidInput("a model call's position is required")
        if not (isinstance(self.prompt_digest, str) and len(self.prompt_digest) == DIGEST_CHARS):
            raise InvalidInput("a model call's prompt digest is a sha256 hex digest")
        if self.queued is not None and self.slot is not None:
            raise InvalidInput("a call queued for a batch takes no slot of its endpoint's limits")
        if self.slot is not None and self.slot.endpoint != self.endpoint:
            raise InvalidInput(f"a call to endpoint {self.endpoint!r} takes a slot of that "
                               f"endpoint, not of {self.slot.endpoint!r}")

    @property
    def steps(self) -> tuple[Step, ...]:
        return steps(self.charge, self.slot)

    def budget_params(self) -> dict[str, Any]:
        """What the call's record keeps of its charge: the estimate and its windows."""
        if self.charge is None:
            return {"estimate": 0, "budget_period": None, "budget_day": None}
        period, day = self.charge.window("period"), self.charge.window("day")
        return {"estimate": self.charge.estimate,
                "budget_period": period.start if period else None,
                "budget_day": day.start.date() if day else None}


def intent_is_one_statement(claim: Claim, intent: Intent) -> bool:
    """Recording an intent is one statement when none of its steps writes before it (a
    queued call is never: whether the Run queued it already is read first)."""
    return intent.queued is None and not any(step.writes_at_intent for step in intent.steps)


@dataclass(frozen=True)
class Usage:
    """What the provider reported a call used, and what it cost: tokens (None when not
    reported; of the prompt's, ``cached_tokens`` read from the provider's prompt cache and
    ``cache_write_tokens`` written to it), latency, the cost in billionths of ``currency``
    (both None: no price), the tokens billed beyond the call's bound (``overrun``: 0 or
    None when within it) and, for a call answered through a provider's batch, what it would
    have cost at the synchronous price (``sync_cost_nanos``, in the same currency)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: int | None = None
    cost_nanos: int | None = None
    currency: str | None = None
    overrun: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    sync_cost_nanos: int | None = None

    def __post_init__(self) -> None:
        _check_count(self.prompt_tokens, "prompt_tokens")
        _check_count(self.completion_tokens, "completion_tokens")
        _check_count(self.latency_ms, "latency_ms")
        _check_count(self.cost_nanos, "cost_nanos")
        _check_count(self.overrun, "overrun")
        _check_count(self.cached_tokens, "cached_tokens")
        _check_count(self.cache_write_tokens, "cache_write_tokens")
        _check_count(self.sync_cost_nanos, "sync_cost_nanos")
        if self.sync_cost_nanos is not None and self.cost_nanos is None:
            raise InvalidInput("a call's synchronous cost is given with its cost")
        if (self.cost_nanos is None) != (self.currency is None):
            raise InvalidInput("a call's cost and its currency are given together, or neither")

    @property
    def tokens(self) -> int:
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    def params(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "latency_ms": self.latency_ms, "cost_nanos": self.cost_nanos,
                "currency": self.currency, "overrun": self.overrun,
                "cached_tokens": self.cached_tokens, "cache_write_tokens": self.cache_write_tokens,
                "sync_cost_nanos": self.sync_cost_nanos}


NO_USAGE = Usage()  # a call that ended without a usage report


@dataclass(frozen=True)
class End:
    """How a call ended: ``answered`` with its ``answer`` (a JSON object), or ``refused`` (the
    provider's error reply: not billed), ``failed`` (no usable answer) or, for a queued call,
    ``withdrawn`` (its batch ended without it) with its ``error``; its usage either way."""

    outcome: str
    usage: Usage = NO_USAGE
    answer: dict[str, Any] | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.outcome == "answered":
            if not isinstance(self.answer, dict):
                raise InvalidInput("a checkpointed answer is a JSON object, "
                                   f"got {type(self.answer).__name__}")
        elif self.outcome not in (*CALL_FAILURES, WITHDRAWN):
            raise InvalidInput(f"an unanswered call's outcome is one of "
                               f"{', '.join((*CALL_FAILURES, WITHDRAWN))}, got {self.outcome!r}")


@dataclass(frozen=True)
class InFlight:
    """A recorded call, in flight: its id, the claim it was made under, and what it carries
    until it ends (its budget ``charge``, its endpoint ``slot``)."""

    call_id: str
    claim: Claim
    charge: budgets.Charge | None
    slot: Slot | None = None

    @property
    def steps(self) -> tuple[Step, ...]:
        return steps(self.charge, self.slot)


def end_is_one_statement(call: InFlight, end: End) -> bool:
    """Recording a call's end is one statement when none of its steps writes after it."""
    return not any(step.writes_at_end for step in call.steps)
