"""A job's budget: bad caps are clear errors, windows per period and UTC day, a budget in money
needs a priced model, and what a call reserves (its bound, or a larger call_estimate)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from flows.errors import InvalidJob
from flows.jobs.budget import Budget, Estimator
from flows.model import CallBound
from flows.prices import ModelPrice, PriceList

PERIOD = datetime(2026, 12, 3, 6, tzinfo=UTC)
PRICES = PriceList(currency="EUR", prices={"m": ModelPrice(input=Decimal(1), output=Decimal(3))})


@pytest.mark.parametrize("kwargs, message", [
    ({"per_period": -1}, "must be 0 or more"),
    ({"per_period": "ten euros"}, "must be a number"),
    ({"per_period": 2.5}, "a float is refused"),
    ({"per_period": True}, "must be a number"),
    ({"per_day": "NaN"}, "must be 0 or more"),
    ({}, "needs a cap"),
    ({"per_period": 10, "unit": "calls"}, "money or tokens"),
    ({"per_period": "10.5", "unit": "tokens"}, "whole tokens"),
])
def test_a_bad_budget_is_a_clear_error(kwargs: dict[str, object], message: str) -> None:
    """Negative, non-numeric, float, missing caps or an unknown unit: InvalidJob naming it."""
    with pytest.raises(InvalidJob, match=message):
        Budget(**kwargs)  # type: ignore[arg-type]


def test_a_budget_has_a_window_per_period_and_per_utc_day() -> None:
    """Money caps are stored in billionths; the day window starts at UTC midnight."""
    budget = Budget(per_period="2.50", per_day=10)
    period, day = budget.windows(PERIOD, PERIOD)
    assert (period.scope, period.start, period.cap) == ("period", PERIOD, 2_500_000_000)
    assert (day.scope, day.start, day.cap) == ("day", datetime(2026, 12, 3, tzinfo=UTC),
                                               10_000_000_000)


def test_a_budget_in_money_needs_a_priced_model() -> None:
    """No price for the model: a clear error naming the settings to set."""
    Budget(per_period=1).check_prices("j", "m", PRICES)
    with pytest.raises(InvalidJob, match="has no price: set RUNLEDGER_MODEL_PRICES"):
        Budget(per_period=1).check_prices("j", "other", PRICES)
    Budget(per_period=100, unit="tokens").check_prices("j", "other", PRICES)


def test_a_call_reserves_its_bound_priced_or_a_larger_call_estimate() -> None:
    """Money: the input bound and max_tokens priced; tokens: the two added; a call_estimate
    below the bound is raised to it, one above it is kept."""
    bound = CallBound(input_tokens=1000, max_tokens=500)
    priced = Estimator("j", Budget(per_period=1), PRICES, PERIOD, PERIOD)
    assert priced.charge("m", bound).estimate == (1000 * 1 + 500 * 3) * 1000
    assert priced.charge("m", bound).currency == "EUR"
    too_low = Estimator("j", Budget(per_period=1, call_estimate="0.000001"), PRICES, PERIOD,
                        PERIOD)
    assert too_low.charge("m", bound).estimate == (1000 * 1 + 500 * 3) * 1000
    tokens = Estimator("j", Budget(per_period=10_000, unit="tokens", call_estimate=150),
                       PRICES, PERIOD, PERIOD)
    assert tokens.charge("x", bound).estimate == 1500 and tokens.charge("x", bound).currency is None
    larger = Estimator("j", Budget(per_period=10_000, unit="tokens", call_estimate=2000),
                       PRICES, PERIOD, PERIOD)
    assert larger.charge("x", bound).estimate == 2000
