"""Models a job's transform can call: an offline extractive summarizer (the default) and an
OpenAI-compatible chat-completions client."""

from flows.model.call_log import CallCount, CallLog, LoggedModel
from flows.model.errors import ModelMisconfigured, ModelRejected, ModelUnavailable
from flows.model.factory import model_from_settings
from flows.model.offline import OfflineModel
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.model.protocol import Generation, Model

__all__ = [
    "CallCount", "CallLog", "Generation", "LoggedModel", "Model", "ModelMisconfigured", "ModelRejected",
    "ModelUnavailable", "OfflineModel", "OpenAICompatibleModel", "model_from_settings",
]
