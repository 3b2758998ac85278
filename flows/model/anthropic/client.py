"""A client for Anthropic's Messages API (``POST {base_url}/v1/messages``) on the official
``anthropic`` SDK, with Anthropic's own features: the system text apart from the turns,
``max_tokens`` on every request, prompt caching (``cache_control`` on a message marked
``cache``), its usage fields (cache reads and writes) and its rate-limit headers.

The SDK never retries (``max_retries=0``): the ledger records every request that leaves and
the pipeline decides (flows.model.anthropic.refusals). Structured output is a forced tool
whose input schema is the output's JSON schema; the tool's input is the answer's JSON text.
Anthropic takes no ``seed``: it is left out of the request (it still shapes the replay digest).
The API key is sent, never logged."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import anthropic
from anthropic.types import Message as AnthropicMessage
from pydantic import SecretStr

from flows.model.announced import announced_limits
from flows.model.anthropic.refusals import MAX_ERROR_BODY, refusal
from flows.model.client import ProviderClient
from flows.model.errors import ModelRejected, ModelUnavailable
from flows.model.protocol import Generation
from flows.model.request import Message, Request

NO_KEY = "no-key"  # the SDK wants a key; without one, the key header is omitted, never sent
REFUSED = "the model refused to answer (stop_reason refusal)"


def tool_name(output: type[Any]) -> str:
    """The forced tool's name: the output model's name, as Anthropic's tool names allow."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", output.__name__)[:64] or "answer"


def _turn(message: Message) -> dict[str, Any]:
    """A turn as Anthropic takes it; a ``cache`` message ends in a cache breakpoint."""
    block: dict[str, Any] = {"type": "text", "text": message.content}
    if message.cache:
        block["cache_control"] = {"type": "ephemeral"}
    return {"role": message.role, "content": [block]}


def _system(request: Request) -> list[dict[str, Any]] | None:
    """The system messages as text blocks, each keeping its cache breakpoint."""
    blocks = [_turn(m)["content"][0] for m in request.messages if m.role == "system"]
    return blocks or None


def generation_of(message: AnthropicMessage, name: str, *, structured: bool) -> Generation:
    """The answer's text (the forced tool's input as JSON for ``structured`` output) and its
    usage: the prompt's tokens are its uncached input plus its cache reads and writes."""
    texts = [b.text for b in message.content if b.type == "text"]
    tools = [b.input for b in message.content if b.type == "tool_use"]
    usage = message.usage
    reads = usage.cache_read_input_tokens
    writes = usage.cache_creation_input_tokens
    prompt = usage.input_tokens + (reads or 0) + (writes or 0)
    model = str(message.model or name)
    if message.stop_reason == "refusal":
        return Generation("".join(texts).strip(), model, prompt, usage.output_tokens,
                          reads, writes, refusal="".join(texts).strip() or REFUSED)
    if structured and tools:
        text = json.dumps(tools[0])
    elif texts:
        text = "".join(texts).strip()
    else:
        raise ModelRejected(
            f"model {name} sent a reply without "
            f"{'a tool_use block' if structured else 'text'} "
            f"(stop_reason {message.stop_reason})")
    return Generation(text, model, prompt, usage.output_tokens, reads, writes)


class AnthropicModel(ProviderClient):
    """A ModelClient answering through Anthropic's Messages API."""

    kind = "anthropic"

    def __init__(
        self,
        base_url: str,
        name: str,
        api_key: SecretStr | None = None,
        *,
        timeout_seconds: float = 60.0,
        max_tokens: int = 1024,
    ) -> None:
        super().__init__(base_url, name, timeout_seconds=timeout_seconds, max_tokens=max_tokens)
        key = api_key.get_secret_value() if api_key is not None else ""
        self._headers: dict[str, Any] = {} if key else {
            "X-Api-Key": anthropic.Omit(), "Authorization": anthropic.Omit()}
        self._client = anthropic.Anthropic(
            base_url=self.base_url, api_key=key or NO_KEY, max_retries=0,
            timeout=anthropic.Timeout(timeout_seconds, connect=min(10.0, timeout_seconds)))

    @property
    def sdk(self) -> anthropic.Anthropic:
        """The never-retrying SDK client (its requests take ``headers``)."""
        return self._client

    @property
    def headers(self) -> dict[str, Any]:
        """The headers every request sends (none of the SDK's key headers without a key)."""
        return self._headers

    @contextmanager
    def asking(self, doing: str | None = None) -> Iterator[None]:
        """Turns the SDK's failures inside into ours, naming the model, where it is and what
        was being done (``doing``, when it is not a message): no answer in time or no
        connection is ``ModelUnavailable``, an error status a refusal, a reply the SDK
        cannot read ``ModelRejected``."""
        what = f" ({doing})" if doing else ""
        try:
            yield
        except anthropic.APITimeoutError as exc:
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url}{what} did not answer within "
                f"{self.timeout_seconds:g} s ({type(exc).__name__})") from exc
        except anthropic.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url}{what} is unreachable: "
                f"{type(cause).__name__}: {cause}") from exc
        except anthropic.APIStatusError as exc:
            raise refusal(self.name + what, exc) from exc
        except (ValueError, anthropic.APIResponseValidationError) as exc:
            raise ModelRejected(
                f"model {self.name}{what} sent a reply that is not "
                f"{'what the API returns' if doing else 'a Messages API message'}: "
                f"{type(exc).__name__}: {str(exc)[:MAX_ERROR_BODY]}") from exc

    def complete(self, request: Request) -> Generation:
        """Answer ``request``: its text, or the forced tool's input as JSON text."""
        body = self.params(request)
        # Sampling parameters the SDK's signature no longer lists go in the body as they are.
        sampling = {k: body.pop(k) for k in ("temperature", "top_p") if k in body}
        with self.asking():
            raw = self._client.messages.with_raw_response.create(
                **body, extra_headers=self._headers, extra_body=sampling or None)
            message = raw.parse()
        answer = generation_of(message, self.name, structured=request.output is not None)
        announced = announced_limits(raw.headers, datetime.now(UTC))
        return Generation(answer.text, answer.model, answer.prompt_tokens,
                          answer.completion_tokens, answer.cached_tokens,
                          answer.cache_write_tokens, refusal=answer.refusal, announced=announced)

    def params(self, request: Request) -> dict[str, Any]:
        """The Messages API request body (what a batch request's ``params`` holds too):
        ``max_tokens`` always (the request's, else this endpoint's), the system text apart,
        a forced tool for structured output."""
        p = request.parameters
        body: dict[str, Any] = {
            "model": self.name, "max_tokens": p.max_tokens or self.max_tokens,
            "messages": [_turn(m) for m in request.turns]}
        system = _system(request)
        if system is not None:
            body["system"] = system
        body.update({k: v for k, v in (("temperature", p.temperature), ("top_p", p.top_p))
                     if v is not None})
        if p.stop:
            body["stop_sequences"] = list(p.stop)
        if request.output is not None:
            name = tool_name(request.output)
            body["tools"] = [{"name": name, "input_schema": request.schema(),
                              "description": f"Answer with a {request.output.__name__}."}]
            body["tool_choice"] = {"type": "tool", "name": name}
        return body

    def close(self) -> None:
        self._client.close()
