"""Models a job's transform can call: an offline extractive summarizer (the default) and an
OpenAI-compatible chat-completions client, and the recording wrapper a transform receives."""

from flows.model.bound import CallBound, InputBound, call_bound
from flows.model.endpoint import DEFAULT, Endpoint, ModelEndpoint, UnknownEndpoint, endpoint_named
from flows.model.errors import (
    EndpointRefusing,
    ModelMisconfigured,
    ModelRejected,
    ModelUnavailable,
)
from flows.model.factory import model_from_settings, prices_from_settings
from flows.model.limiter import EndpointLimiter
from flows.model.offline import OfflineModel
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.model.price_block import ModelPrices
from flows.model.protocol import Generation, Model
from flows.model.recorded import CallCount, RecordedModel, prompt_digest

__all__ = [
    "DEFAULT",
    "CallBound",
    "CallCount",
    "Endpoint",
    "EndpointLimiter",
    "EndpointRefusing",
    "Generation",
    "InputBound",
    "Model",
    "ModelEndpoint",
    "ModelMisconfigured",
    "ModelPrices",
    "ModelRejected",
    "ModelUnavailable",
    "OfflineModel",
    "OpenAICompatibleModel",
    "RecordedModel",
    "UnknownEndpoint",
    "call_bound",
    "endpoint_named",
    "model_from_settings",
    "prices_from_settings",
    "prompt_digest",
]
