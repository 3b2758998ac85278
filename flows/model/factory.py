"""Choose the model from settings: RUNLEDGER_MODEL=offline (default), openai or anthropic; and
the client of an endpoint's kind."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from prefect.blocks.core import Block
from pydantic import SecretStr

from flows.model.client import EXAMPLE_URLS, Kind
from flows.model.errors import ModelMisconfigured
from flows.model.offline import OfflineModel
from flows.model.price_block import ModelPrices
from flows.model.protocol import ModelClient
from flows.model.providers import client_class
from flows.prices import PriceList
from flows.settings import RunledgerSettings

B = TypeVar("B", bound=Block)


def load_block(kind: type[B], name: str) -> B:
    """The saved block ``name`` of ``kind``, loaded synchronously: Block.load dispatches on its
    context, and in a tick's thread (inside an async flow run) it would return a coroutine."""
    load: Any = kind.load
    return cast(B, load(name, _sync=True))


def api_key(settings: RunledgerSettings) -> SecretStr | None:
    """The API key from RUNLEDGER_MODEL_API_KEY, else from the Prefect Secret block named by
    RUNLEDGER_MODEL_API_KEY_BLOCK, else none (local servers often need none)."""
    if settings.model_api_key is not None:
        return settings.model_api_key
    if not settings.model_api_key_block:
        return None
    return api_key_in_block(settings.model_api_key_block, "RUNLEDGER_MODEL_API_KEY_BLOCK")


def api_key_in_block(name: str, named_by: str) -> SecretStr:
    """The API key the Prefect Secret block ``name`` holds (``named_by`` is the setting that
    names it, for the error)."""
    from prefect.blocks.system import Secret

    try:
        block = cast("Secret[str]", load_block(Secret, name))
    except ValueError as exc:
        raise ModelMisconfigured(f"no Prefect Secret block named {name!r} ({named_by})") from exc
    return SecretStr(str(block.get()))


def model_from_settings(settings: RunledgerSettings | None = None) -> ModelClient:
    """The model the settings select; an incomplete openai or anthropic configuration is a
    clear error."""
    settings = settings or RunledgerSettings()
    if settings.model == "offline":
        return OfflineModel(delay_seconds=settings.offline_model_delay_seconds,
                            max_tokens=settings.model_max_tokens)
    if not settings.model_base_url or not settings.model_name:
        raise ModelMisconfigured(
            f"RUNLEDGER_MODEL={settings.model} needs RUNLEDGER_MODEL_BASE_URL "
            f"(e.g. {EXAMPLE_URLS[settings.model]}) "
            "and RUNLEDGER_MODEL_NAME"
        )
    return client_of(settings.model, settings.model_base_url, settings.model_name,
                     api_key(settings), timeout_seconds=settings.model_timeout_seconds,
                     max_tokens=settings.model_max_tokens)


def client_of(kind: Kind, base_url: str, name: str, key: SecretStr | None, *,
              timeout_seconds: float, max_tokens: int) -> ModelClient:
    """A new client of an endpoint's ``kind`` of API (the caller closes it)."""
    return client_class(kind)(base_url, name, key, timeout_seconds=timeout_seconds,
                              max_tokens=max_tokens)


def prices_from_settings(settings: RunledgerSettings | None = None) -> PriceList:
    """The model prices: from the Prefect block RUNLEDGER_MODEL_PRICES_BLOCK names, else from
    RUNLEDGER_MODEL_PRICES and RUNLEDGER_MODEL_CURRENCY (none: every model shows "no price")."""
    settings = settings or RunledgerSettings()
    if not settings.model_prices_block:
        return PriceList(currency=settings.model_currency, prices=settings.model_prices)
    return prices_in_block(settings.model_prices_block, "RUNLEDGER_MODEL_PRICES_BLOCK")


def prices_in_block(name: str, named_by: str) -> PriceList:
    """The prices the saved "runledger model prices" block ``name`` holds (``named_by`` is
    the setting that names it, for the error)."""
    try:
        block = load_block(ModelPrices, name)
    except ValueError as exc:
        raise ModelMisconfigured(
            f"no \"runledger model prices\" block named {name!r} ({named_by})") from exc
    if not isinstance(block, ModelPrices):
        raise ModelMisconfigured(f"block {name!r} is not a \"runledger model prices\" block")
    return block.price_list()
