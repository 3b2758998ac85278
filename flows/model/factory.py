"""Choose the model from settings: RUNLEDGER_MODEL=offline (default) or openai."""

from __future__ import annotations

from typing import cast

from pydantic import SecretStr

from flows.model.errors import ModelMisconfigured
from flows.model.offline import OfflineModel
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.model.protocol import Model
from flows.settings import RunledgerSettings


def api_key(settings: RunledgerSettings) -> SecretStr | None:
    """The API key from RUNLEDGER_MODEL_API_KEY, else from the Prefect Secret block named by
    RUNLEDGER_MODEL_API_KEY_BLOCK, else none (local servers often need none)."""
    if settings.model_api_key is not None:
        return settings.model_api_key
    if not settings.model_api_key_block:
        return None
    from prefect.blocks.system import Secret

    try:
        block = cast("Secret[str]", Secret.load(settings.model_api_key_block))
    except ValueError as exc:
        raise ModelMisconfigured(
            f"no Prefect Secret block named {settings.model_api_key_block!r} "
            "(RUNLEDGER_MODEL_API_KEY_BLOCK)"
        ) from exc
    return SecretStr(str(block.get()))


def model_from_settings(settings: RunledgerSettings | None = None) -> Model:
    """The model the settings select; an incomplete openai configuration is a clear error."""
    settings = settings or RunledgerSettings()
    if settings.model == "offline":
        return OfflineModel(delay_seconds=settings.offline_model_delay_seconds)
    if not settings.model_base_url or not settings.model_name:
        raise ModelMisconfigured(
            "RUNLEDGER_MODEL=openai needs RUNLEDGER_MODEL_BASE_URL (e.g. http://localhost:11434/v1) "
            "and RUNLEDGER_MODEL_NAME"
        )
    return OpenAICompatibleModel(
        settings.model_base_url, settings.model_name, api_key(settings),
        timeout_seconds=settings.model_timeout_seconds,
    )
