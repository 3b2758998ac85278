"""A Prefect Block holding model prices, so that a person can edit them in the Prefect UI;
RUNLEDGER_MODEL_PRICES_BLOCK names the saved block a worker reads."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field

from flows.prices import Currency, ModelPrice, PriceList


class ModelPrices(Block):
    """Prices per million input and output tokens per model name, in one currency."""

    _block_type_name = "runledger model prices"
    _block_type_slug = "runledger-model-prices"
    _description = ("What runledger charges a job per model call: a price per million input "
                    "and output tokens per model name, in one ISO 4217 currency.")

    currency: Currency = Field(description="ISO 4217 code of the prices' currency, e.g. USD.")
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict, description="Per model name (as the provider reports it): "
                                          "{\"input\": per million, \"output\": per million}.")

    def price_list(self) -> PriceList:
        """The prices this block holds."""
        return PriceList(currency=self.currency, prices=self.prices)
