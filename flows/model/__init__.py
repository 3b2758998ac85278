"""Models a job's transform can call: an offline extractive summarizer (the default), an
OpenAI-compatible chat-completions client and an Anthropic Messages API client, and the
recording wrapper a transform receives (messages, parameters and structured output:
``Message``, ``Request``, ``Model.generate``). The providers' clients are imported from their
own modules (``flows.model.openai_compatible``, ``flows.model.anthropic``), and only there:
see flows.model.providers."""

from flows.model.bound import CallBound, InputBound, call_bound, request_bound
from flows.model.endpoint import DEFAULT, Endpoint, ModelEndpoint, UnknownEndpoint, endpoint_named
from flows.model.errors import (
    EndpointRefusing,
    InvalidModelRequest,
    ModelMisconfigured,
    ModelRefused,
    ModelRejected,
    ModelUnavailable,
    QueuedForBatch,
)
from flows.model.factory import model_from_settings, prices_from_settings
from flows.model.limiter import EndpointLimiter
from flows.model.offline import OfflineModel
from flows.model.price_block import ModelPrices
from flows.model.protocol import Generation, Model, ModelClient
from flows.model.recorded import (
    BatchQueue,
    CallCount,
    RecordedModel,
    answer_document,
    custom_id_of,
    prompt_digest,
    request_digest,
    usage_of,
)
from flows.model.request import Message, Parameters, Request

__all__ = [
    "DEFAULT",
    "BatchQueue",
    "CallBound",
    "CallCount",
    "Endpoint",
    "EndpointLimiter",
    "EndpointRefusing",
    "Generation",
    "InputBound",
    "InvalidModelRequest",
    "Message",
    "Model",
    "ModelClient",
    "ModelEndpoint",
    "ModelMisconfigured",
    "ModelPrices",
    "ModelRefused",
    "ModelRejected",
    "ModelUnavailable",
    "OfflineModel",
    "Parameters",
    "QueuedForBatch",
    "RecordedModel",
    "Request",
    "UnknownEndpoint",
    "answer_document",
    "call_bound",
    "custom_id_of",
    "endpoint_named",
    "model_from_settings",
    "prices_from_settings",
    "prompt_digest",
    "request_bound",
    "request_digest",
    "usage_of",
]
