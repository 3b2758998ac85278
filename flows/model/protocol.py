"""The two sides of a model call: ``Model``, what a job's transform calls, and ``ModelClient``,
what answers it for one provider (a provider is one client class; the recorded model a
transform receives turns its ``generate`` into a ``Request`` for the client's ``complete``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from flows.model.announced import Announced
from flows.model.request import Message, Request


@dataclass(frozen=True)
class Generation:
    """One model answer: its text (for structured output, the JSON the provider wrote), the
    name of the model that wrote it, and the tokens its provider reported (None when it
    reported none): the prompt's (cache reads and writes included), the completion's, the
    prompt tokens read from the provider's cache and those written to it. ``parsed`` is the
    validated instance when the request asked for an ``output`` model; ``refusal`` the
    provider's stated refusal (the call answered and was paid, with no answer to use);
    ``announced`` the rate limits the answer's headers announced."""

    text: str
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    parsed: BaseModel | None = None
    refusal: str | None = None
    announced: Announced | None = None


class ModelClient(Protocol):
    """Answers requests at one provider. Failures raise ``ModelUnavailable`` (transient:
    retried) or ``ModelRejected`` (permanent: the Run fails); a refusal by the model itself is
    an answer (``Generation.refusal``), since it was paid for. ``endpoint`` names where the
    calls go (the base URL, or ``offline``), as model call records show it; ``max_tokens`` is
    the most tokens an answer may use when a request sets none (what a budget reserves)."""

    name: str
    endpoint: str
    max_tokens: int

    def complete(self, request: Request) -> Generation:
        """Answer ``request`` (free text, or JSON of ``request.output``'s schema)."""
        ...

    def close(self) -> None:
        """Release connections; the client is not used afterwards."""
        ...


class Model(Protocol):
    """What a transform calls. ``generate`` asks one model call: a ``prompt`` (a user message,
    after ``system`` when given) and/or ``messages`` in order, the sampling parameters, and
    ``output``, a pydantic model the answer must validate into (``Generation.parsed``).
    Failures raise ``ModelUnavailable`` (transient: retried) or ``ModelRejected`` (permanent:
    the Run fails; ``ModelRefused`` when the model refused); an answer that does not validate
    raises ``ValidationFailed``; a request that cannot be sent raises ``InvalidModelRequest``
    before anything is recorded. ``endpoint`` names where the calls go (the base URL, or
    ``offline``), as model call records show it; ``max_tokens`` is the most tokens an answer
    may use, asked of the provider unless a call asks less (what a budget reserves)."""

    name: str
    endpoint: str
    max_tokens: int

    def generate(self, prompt: str | None = None, *, system: str | None = None,
                 messages: Sequence[Message] | None = None, output: type[BaseModel] | None = None,
                 temperature: float | None = None, max_tokens: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stop: str | Sequence[str] | None = None) -> Generation:
        """Answer the prompt and messages (structured as ``output`` when given)."""
        ...

    def close(self) -> None:
        """Release connections; the model is not used afterwards."""
        ...
