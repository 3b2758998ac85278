"""A model request: the messages, parameters and output schema of one call, whatever provider
answers it. Its ``shape`` is everything that decides the answer, so the replay digest covers it
all: a changed message, parameter, schema or model is a new call, never a stale replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")


@dataclass(frozen=True)
class Message:
    """One turn of a conversation. ``cache`` marks a prompt-cache breakpoint after this message
    (Anthropic's ``cache_control``; OpenAI caches long prefixes by itself and ignores it)."""

    role: Role
    content: str
    cache: bool = False


@dataclass(frozen=True)
class Parameters:
    """The sampling parameters a call sets; None leaves the provider's default (``max_tokens``:
    None is the endpoint's ``max_tokens``, the most an answer may use)."""

    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def given(self) -> dict[str, Any]:
        """The parameters set, by their common name (``stop`` as a list)."""
        found: dict[str, Any] = {k: v for k, v in (
            ("temperature", self.temperature), ("max_tokens", self.max_tokens),
            ("top_p", self.top_p), ("seed", self.seed)) if v is not None}
        if self.stop:
            found["stop"] = list(self.stop)
        return found


@dataclass(frozen=True)
class Request:
    """What one model call asks: its messages in order, its parameters, and ``output``, the
    pydantic model its answer must validate into (None: free text)."""

    messages: tuple[Message, ...]
    parameters: Parameters = field(default_factory=Parameters)
    output: type[BaseModel] | None = None

    @property
    def system(self) -> str | None:
        """The system messages' text, joined (providers that take it apart from the turns)."""
        texts = [m.content for m in self.messages if m.role == "system"]
        return "\n\n".join(texts) if texts else None

    @property
    def turns(self) -> tuple[Message, ...]:
        """The messages other than the system ones, in order."""
        return tuple(m for m in self.messages if m.role != "system")

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema of ``output`` (None for free text)."""
        return None if self.output is None else self.output.model_json_schema()

    def shape(self, model: str) -> dict[str, Any]:
        """Everything that decides the answer, as a JSON document (what the digest hashes)."""
        return {
            "model": model,
            "messages": [[m.role, m.content, m.cache] for m in self.messages],
            "parameters": self.parameters.given(),
            "output": self.schema(),
        }
