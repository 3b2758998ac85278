"""How a transform's ``generate`` becomes a ``Request``, and a provider's answer its result:
the request is checked before anything is recorded or paid, and the answer is checked the same
way whether it just arrived or was replayed from a checkpoint (a refusal refused, structured
output validated into its pydantic model)."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from flows.errors import ValidationFailed
from flows.model.errors import InvalidModelRequest, ModelRefused
from flows.model.protocol import Generation
from flows.model.request import ROLES, Message, Parameters, Request

MAX_EVIDENCE = 300  # characters of a rejected answer quoted in its error


def request_of(prompt: str | None, *, system: str | None, messages: Sequence[Message] | None,
               output: Any, parameters: Parameters, max_tokens: int) -> Request:
    """The request a call asks, checked: a prompt or messages, known roles, an ``output`` that
    is a pydantic model, and ``max_tokens`` between 1 and the endpoint's ``max_tokens``."""
    given = list(messages or ())
    for message in given:
        if not isinstance(message, Message) or message.role not in ROLES:
            raise InvalidModelRequest(
                f"a message must be a flows.model.Message with a role among {', '.join(ROLES)}; "
                f"got {message!r}")
    if prompt is None and not given:
        raise InvalidModelRequest("generate() needs a prompt or messages=[Message('user', ...)]")
    if prompt is not None:
        given.append(Message("user", prompt))
    if system is not None:
        given.insert(0, Message("system", system))
    if output is not None and not (isinstance(output, type) and issubclass(output, BaseModel)):
        raise InvalidModelRequest(
            f"output must be a pydantic BaseModel subclass (class MyAnswer(BaseModel): ...), "
            f"got {output!r}")
    asked = parameters.max_tokens
    if asked is not None and not 1 <= asked <= max_tokens:
        raise InvalidModelRequest(
            f"max_tokens must be between 1 and the endpoint's max_tokens ({max_tokens}), got "
            f"{asked}; raise the endpoint's max_tokens (RUNLEDGER_MODEL_MAX_TOKENS) or ask less")
    return Request(tuple(given), parameters, output)


def parameters_of(temperature: float | None, max_tokens: int | None, top_p: float | None,
                  seed: int | None, stop: str | Sequence[str] | None) -> Parameters:
    """The parameters as ``generate`` takes them (``stop``: one string or several)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return Parameters(temperature, max_tokens, top_p, seed, stops)


def plain_prompt(request: Request) -> tuple[str, str | None] | None:
    """``(prompt, system)`` when ``request`` is what ``generate(prompt, system=...)`` asked
    before requests had messages, parameters and schemas (its replay digest stays the same);
    None otherwise."""
    if request.output is not None or request.parameters.given():
        return None
    roles = [m.role for m in request.messages]
    if any(m.cache for m in request.messages) or roles not in (["user"], ["system", "user"]):
        return None
    return request.messages[-1].content, request.system


def answer_of(request: Request, answer: Generation) -> Generation:
    """The answer to use: a refusal is ``ModelRefused``; with an ``output`` model, the answer
    validated into it (``parsed``), or ``ValidationFailed`` quoting the raw answer."""
    if answer.refusal is not None:
        raise ModelRefused(f"model {answer.model} refused to answer: {answer.refusal}")
    if request.output is None:
        return answer
    try:
        parsed = request.output.model_validate_json(answer.text)
    except PydanticValidationError as exc:
        quoted = answer.text[:MAX_EVIDENCE] + ("..." if len(answer.text) > MAX_EVIDENCE else "")
        raise ValidationFailed(
            f"the answer of model {answer.model} is not a valid {request.output.__name__} "
            f"({exc.error_count()} errors; first: {_first_error(exc)}); answer: {quoted!r}"
        ) from exc
    return dataclasses.replace(answer, parsed=parsed)


def _first_error(exc: PydanticValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "the answer"
    return f"{where}: {error['msg']}"


class Unrecorded(ABC):
    """A provider's client used as a ``Model`` without a ledger (tests, one-off scripts): its
    ``generate`` asks ``complete`` directly, checked and validated as a recorded call is."""

    name: str
    max_tokens: int

    @abstractmethod
    def complete(self, request: Request) -> Generation:
        """Answer ``request`` (free text, or JSON of ``request.output``'s schema)."""

    def generate(self, prompt: str | None = None, *, system: str | None = None,
                 messages: Sequence[Message] | None = None, output: type[BaseModel] | None = None,
                 temperature: float | None = None, max_tokens: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stop: str | Sequence[str] | None = None) -> Generation:
        """Answer as ``Model.generate`` does, nothing recorded."""
        request = request_of(prompt, system=system, messages=messages, output=output,
                             parameters=parameters_of(temperature, max_tokens, top_p, seed, stop),
                             max_tokens=self.max_tokens)
        return answer_of(request, self.complete(request))
