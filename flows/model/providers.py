"""Each kind of provider's clients, its module imported when a client of that kind is first
made (``flows.lazy``): the ``anthropic`` SDK alone costs a process about a second of CPU as it
starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pydantic import SecretStr

from flows.lazy import loaded
from flows.model.client import Kind

if TYPE_CHECKING:
    from flows.model.batch.protocol import BatchClient
    from flows.model.protocol import ModelClient

# kind -> "module:class" of its synchronous client and of its Batch API client.
CLIENTS: dict[Kind, str] = {
    "openai": "flows.model.openai_compatible:OpenAICompatibleModel",
    "anthropic": "flows.model.anthropic.client:AnthropicModel",
}
BATCH_CLIENTS: dict[Kind, str] = {
    "openai": "flows.model.batch.openai:OpenAIBatchClient",
    "anthropic": "flows.model.batch.anthropic:AnthropicBatchClient",
}


class MakesClient(Protocol):
    def __call__(self, base_url: str, name: str, key: SecretStr | None, *,
                 timeout_seconds: float, max_tokens: int) -> ModelClient: ...


class MakesBatchClient(Protocol):
    def __call__(self, base_url: str, name: str, key: SecretStr | None, *,
                 timeout_seconds: float, max_tokens: int) -> BatchClient: ...


def client_class(kind: Kind) -> MakesClient:
    """The synchronous client of ``kind``."""
    made: MakesClient = loaded(CLIENTS[kind])
    return made


def batch_client_class(kind: Kind) -> MakesBatchClient:
    """The Batch API client of ``kind``."""
    made: MakesBatchClient = loaded(BATCH_CLIENTS[kind])
    return made
