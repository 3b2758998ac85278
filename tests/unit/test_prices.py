"""The cost of a call's tokens: uncached input at ``input``, cache reads at ``cached_input``
and cache writes at ``cache_write`` (each ``input`` when the model has no such price), output
at ``output``."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import ValidationError

from flows.prices import ModelPrice, PriceList

CACHED = PriceList(currency="USD", prices={"claude": ModelPrice(
    input=Decimal(3), output=Decimal(15), cached_input=Decimal("0.30"),
    cache_write=Decimal("3.75"))})
PLAIN = PriceList(currency="USD", prices={"gpt": ModelPrice(input=Decimal("0.15"),
                                                            output=Decimal("0.60"))})


def test_cache_reads_and_writes_are_priced_apart_from_the_uncached_input() -> None:
    """1250 prompt tokens of which 900 read and 300 written: 50 at input, 900 at
    cached_input, 300 at cache_write, plus the output."""
    cost = CACHED.cost_nanos("claude", 1250, 20, cached_tokens=900, cache_write_tokens=300)
    assert cost == 50 * 3000 + 900 * 300 + 300 * 3750 + 20 * 15000


def test_a_model_without_cache_prices_charges_its_cached_tokens_at_the_input_price() -> None:
    """Without cached_input and cache_write, every prompt token costs ``input``: the same as
    a call without cache use."""
    assert PLAIN.cost_nanos("gpt", 1000, 100, cached_tokens=600) == PLAIN.cost_nanos(
        "gpt", 1000, 100) == 1000 * 150 + 100 * 600


def test_openai_cached_tokens_cost_the_cached_input_price() -> None:
    """OpenAI reports cached tokens inside its prompt tokens: those cost cached_input."""
    prices = PriceList(currency="USD", prices={"gpt": ModelPrice(
        input=Decimal("0.15"), output=Decimal("0.60"), cached_input=Decimal("0.075"))})
    assert prices.cost_nanos("gpt", 1000, 0, cached_tokens=400) == 600 * 150 + 400 * 75


def test_an_unknown_usage_or_model_has_no_cost() -> None:
    """No price, or no reported usage: None, never zero."""
    assert CACHED.cost_nanos("other", 10, 10, cached_tokens=5) is None
    assert CACHED.cost_nanos("claude", None, 10, cached_tokens=5) is None


def test_cache_prices_are_optional_and_never_negative() -> None:
    """A price without cache prices reads as before; a negative cache price is refused."""
    assert ModelPrice.model_validate({"input": 1, "output": 2}).cached_input is None
    with pytest.raises(ValidationError):
        ModelPrice.model_validate({"input": 1, "output": 2, "cache_write": -1})
