"""A job's budget: a cap on what it may spend per period, and optionally per UTC day across all
its periods (backfills included), in money (the model prices' currency) or in tokens (for a
model without a price). Before each model call the worker reserves the most the call can cost
against every window in the ledger, in one guarded statement each; the answer settles it to the
real cost. So what is spent never passes a cap, whatever the number of threads, processes and
hosts, as long as the provider honours the ``max_tokens`` each call sends.

What a call reserves: its bound (``flows.model.bound``: its input tokens bounded from above plus
its ``max_tokens``), priced with the endpoint's prices for a budget in money, or ``call_estimate``
when the job gives a larger one (in the budget's unit); a ``call_estimate`` below the bound is
raised to it. A provider that bills more than the bound is recorded on the call (its
``overrun``), and reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Literal

from flows.errors import InvalidJob
from flows.model import CallBound
from flows.prices import PriceList, format_money, nanos
from store import Charge, Window

Unit = Literal["money", "tokens"]


def _amount(value: object, what: str) -> Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str | Decimal):
        raise InvalidJob(f"budget {what} must be a number such as 5 or \"2.50\" (a float is "
                         f"refused: money is exact), got {value!r}")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InvalidJob(f"budget {what} must be a number such as 5 or \"2.50\", "
                         f"got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise InvalidJob(f"budget {what} must be 0 or more, got {value!r}")
    return amount


@dataclass(frozen=True)
class Budget:
    """What a job may spend: ``per_period`` (each of its periods) and/or ``per_day`` (each UTC
    day, all its periods together), in ``unit``: ``money`` (in the model prices' currency,
    e.g. ``Budget(per_period="2.50")``) or ``tokens`` (``Budget(per_period=50_000,
    unit="tokens")``). ``call_estimate``: what one call may cost, in that unit; a call reserves
    it when it is above the call's bound, the bound otherwise (a lower one is raised to it)."""

    per_period: int | str | Decimal | None = None
    per_day: int | str | Decimal | None = None
    unit: Unit = "money"
    call_estimate: int | str | Decimal | None = None
    _caps: tuple[Decimal | None, Decimal | None, Decimal | None] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.unit not in ("money", "tokens"):
            raise InvalidJob(f"budget unit must be money or tokens, got {self.unit!r}")
        caps = (_amount(self.per_period, "per_period"), _amount(self.per_day, "per_day"),
                _amount(self.call_estimate, "call_estimate"))
        if caps[0] is None and caps[1] is None:
            raise InvalidJob("a budget needs a cap: per_period, per_day or both")
        if self.unit == "tokens" and any(c is not None and c != int(c) for c in caps):
            raise InvalidJob("a budget in tokens counts whole tokens")
        object.__setattr__(self, "_caps", caps)

    def stored(self, amount: Decimal) -> int:
        """An amount in this budget's unit as the ledger stores it (billionths, or tokens)."""
        return nanos(amount) if self.unit == "money" else int(amount)

    def shown(self, stored: int, currency: str | None) -> str:
        """A stored amount for people."""
        return format_money(stored, currency) if self.unit == "money" else f"{stored} tokens"

    def check_prices(self, job: str, model: str, prices: PriceList) -> None:
        """A budget in money needs the job's model to have a price: a clear error otherwise
        (raised before any Run is claimed, so nothing is written)."""
        if self.unit == "money" and prices.price(model) is None:
            raise InvalidJob(
                f"job {job} has a budget in money but model {model!r} has no price: set "
                f"RUNLEDGER_MODEL_PRICES (or the prices block) and RUNLEDGER_MODEL_CURRENCY, or "
                "give the budget in tokens (Budget(..., unit=\"tokens\"))")

    def windows(self, period_start: datetime, day: datetime) -> tuple[Window, ...]:
        """The windows a call of the period starting ``period_start`` on UTC ``day`` counts in."""
        per_period, per_day, _ = self._caps
        found: list[Window] = []
        if per_period is not None:
            found.append(Window("period", period_start, self.stored(per_period)))
        if per_day is not None:
            midnight = datetime.combine(day.astimezone(UTC).date(), time(), UTC)
            found.append(Window("day", midnight, self.stored(per_day)))
        return tuple(found)


class Estimator:
    """What each call of one job in one tick reserves (see the module's docstring)."""

    def __init__(self, job: str, budget: Budget, prices: PriceList,
                 period_start: datetime, day: datetime) -> None:
        self.job = job
        self.budget = budget
        self.prices = prices
        self.windows = budget.windows(period_start, day)
        given = budget._caps[2]
        self.given = None if given is None else budget.stored(given)

    def charge(self, model: str, bound: CallBound) -> Charge:
        """What a call of ``model`` whose use is at most ``bound`` reserves."""
        return Charge(self.job, self.budget.unit,
                      self.prices.currency if self.budget.unit == "money" else None,
                      self.estimate(model, bound), self.windows)

    def estimate(self, model: str, bound: CallBound) -> int:
        """The bound in the budget's unit, or ``call_estimate`` when that is larger (one given
        too low is raised to the bound: it would let the cap be passed)."""
        if self.budget.unit == "tokens":
            most = bound.tokens
        else:
            self.budget.check_prices(self.job, model, self.prices)  # a price, or refused
            most = bound.cost_nanos(self.prices, model) or 0
        return most if self.given is None else max(self.given, most)


def spent_text(budget: Budget, spent: int, cap: int, currency: str | None) -> str:
    """``spent 2.400000 EUR of 2.500000 EUR``: for the OverBudget state and event."""
    return f"spent {budget.shown(spent, currency)} of {budget.shown(cap, currency)}"

