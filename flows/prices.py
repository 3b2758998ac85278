"""What a model's tokens cost: a price per million input (prompt) and output (completion)
tokens per model name (and, optionally, per million prompt tokens read from the provider's
cache and written to it), in one currency the user names (an ISO 4217 code). Prices come from
settings (RUNLEDGER_MODEL_PRICES, RUNLEDGER_MODEL_CURRENCY) or a Prefect block
(``ModelPrices``, editable in the UI); a model without a price costs "no price", never a guess."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Annotated

import pycountry
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

NANOS = Decimal(10) ** 9  # costs are stored in billionths of the currency's unit
MILLION = Decimal(10) ** 6
BATCH_MULTIPLIER = Decimal("0.5")  # OpenAI's Batch API and Anthropic's Message Batches


def iso_currency(code: str) -> str:
    """An ISO 4217 currency code such as EUR or USD (upper-cased); anything else is refused."""
    if not isinstance(code, str) or pycountry.currencies.get(alpha_3=code.strip().upper()) is None:
        raise ValueError(f"currency must be an ISO 4217 code such as EUR, USD or JPY, got {code!r}")
    return code.strip().upper()


Currency = Annotated[str, AfterValidator(iso_currency)]


class ModelPrice(BaseModel):
    """A model's price per million tokens, read and written (numbers or decimal strings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Decimal = Field(ge=0, description="Price per million prompt (input) tokens.")
    output: Decimal = Field(ge=0, description="Price per million completion (output) tokens.")
    cached_input: Decimal | None = Field(
        default=None, ge=0, description="Price per million prompt tokens read from the "
                                        "provider's prompt cache (default: ``input``).")
    cache_write: Decimal | None = Field(
        default=None, ge=0, description="Price per million prompt tokens written to the "
                                        "provider's prompt cache (default: ``input``).")
    batch: Decimal = Field(
        default=BATCH_MULTIPLIER, gt=0, le=1,
        description="What a call through the provider's Batch API costs, as a share of the "
                    "synchronous price (OpenAI and Anthropic charge half: 0.5).")

    def batched(self) -> ModelPrice:
        """This price as its Batch API charges it: every token price times ``batch``."""
        def cut(amount: Decimal | None) -> Decimal | None:
            return None if amount is None else amount * self.batch
        return ModelPrice(input=self.input * self.batch, output=self.output * self.batch,
                          cached_input=cut(self.cached_input), cache_write=cut(self.cache_write),
                          batch=Decimal(1))


def nanos(amount: Decimal) -> int:
    """An amount of money in billionths of its unit, rounded half to even."""
    return int((amount * NANOS).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def money(amount_nanos: int) -> Decimal:
    """Billionths of a currency's unit as a Decimal amount."""
    return Decimal(amount_nanos) / NANOS


class PriceList(BaseModel):
    """Prices per model name in one currency; a model not listed has no price."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: Currency | None = None
    prices: dict[str, ModelPrice] = Field(default_factory=dict)

    def model_post_init(self, context: object) -> None:
        if self.prices and self.currency is None:
            raise ValueError("prices need their currency: set RUNLEDGER_MODEL_CURRENCY (or the "
                             "block's currency) to an ISO 4217 code such as USD")

    def batched(self) -> PriceList:
        """These prices as the providers' Batch APIs charge them (each model's ``batch``)."""
        return PriceList(currency=self.currency,
                         prices={name: p.batched() for name, p in self.prices.items()})

    def price(self, model: str) -> ModelPrice | None:
        """The price of ``model``, if it has one."""
        return self.prices.get(model)

    def cost_nanos(self, model: str, prompt_tokens: int | None, completion_tokens: int | None,
                   *, cached_tokens: int | None = None,
                   cache_write_tokens: int | None = None) -> int | None:
        """What the tokens cost in billionths of the currency; None without a price or without
        reported usage (an unknown cost is never shown as zero). Of the prompt's tokens, those
        read from the cache cost ``cached_input`` and those written to it ``cache_write``
        (each ``input`` when the model has no such price); the rest cost ``input``."""
        price = self.price(model)
        if price is None or prompt_tokens is None or completion_tokens is None:
            return None
        reads, writes = cached_tokens or 0, cache_write_tokens or 0
        uncached = max(0, prompt_tokens - reads - writes)
        read_price = price.input if price.cached_input is None else price.cached_input
        write_price = price.input if price.cache_write is None else price.cache_write
        return nanos((uncached * price.input + reads * read_price + writes * write_price
                      + completion_tokens * price.output) / MILLION)


NO_PRICES = PriceList()


def format_money(amount_nanos: int | None, currency: str | None, digits: int = 6) -> str:
    """An amount for people: ``0.004500 EUR``; ``no price`` when unknown."""
    if amount_nanos is None or currency is None:
        return "no price"
    return f"{money(amount_nanos):.{digits}f} {currency}"
