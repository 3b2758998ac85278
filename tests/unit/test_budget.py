"""A job's budget: bad caps are clear errors, windows per period and UTC day, a budget in money
needs a priced model, and how a call's estimate is made."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from flows.errors import InvalidJob
from flows.jobs.budget import Budget, Estimator
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


def test_the_estimate_is_the_prompt_size_then_the_largest_real_cost() -> None:
    """Before any call: prompt characters / 4 as input tokens and as many output tokens,
    priced; then the most a call really cost; a given call_estimate always."""
    estimator = Estimator("j", Budget(per_period=1), PRICES, PERIOD, PERIOD)
    assert estimator.charge("m", 4000).estimate == (1000 * 1 + 1000 * 3) * 1000
    estimator.learn(250, 10)
    estimator.learn(100, 10)
    assert estimator.charge("m", 4000).estimate == 250
    fixed = Estimator("j", Budget(per_period=1000, unit="tokens", call_estimate=150),
                      PRICES, PERIOD, PERIOD)
    assert fixed.charge("x", 10).estimate == 150 and fixed.charge("x", 10).currency is None
