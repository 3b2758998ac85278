"""A client for OpenAI-compatible chat-completions endpoints (vLLM, Ollama, LiteLLM's proxy,
llama.cpp, OpenAI), on the official ``openai`` SDK.

The SDK never retries (``max_retries=0``): each failure is classified so that the pipeline
decides, and every request that leaves is one model call the ledger recorded. A 429 (or a 503
with a pause hint: Retry-After, x-ratelimit-reset-*) is ``rate_limited``: the endpoint's
limiter pauses every worker and tries the call again; other transient failures go to the
stage's retries. The answer is not validated here: the recorded model validates structured
output, so that a replayed checkpoint is validated the same way. The API key is sent, never
logged."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import openai
from openai.lib._parsing import type_to_response_format_param
from openai.types.chat import ChatCompletion
from pydantic import SecretStr

from flows.model.announced import Announced, announced_limits
from flows.model.client import ProviderClient
from flows.model.errors import ModelRejected, ModelUnavailable
from flows.model.protocol import Generation
from flows.model.request import Request
from flows.retry_after import pause_hint

TRANSIENT_STATUSES = frozenset({408, 429})  # besides 5xx: the server asks to try again later
MAX_ERROR_BODY = 300
# The SDK wants a key; local servers want none: this placeholder is never sent (the request
# omits its Authorization header when no key is configured).
NO_KEY = "no-key"


def transient_status(status: int) -> bool:
    """Whether a provider's error status asks to try again later (408, 429, 5xx) rather than
    refusing the request for good (other 4xx)."""
    return status in TRANSIENT_STATUSES or status >= 500


def _snippet(error: openai.APIStatusError) -> str:
    text = error.response.text.strip().replace("\n", " ")
    return text[:MAX_ERROR_BODY] + ("..." if len(text) > MAX_ERROR_BODY else "")


def generation_of(completion: ChatCompletion, fallback_model: str,
                  announced: Announced | None = None) -> Generation:
    """The answer a chat completion carries (an answer of the chat-completions endpoint, or
    the body of a batch's result line): its text, or the model's refusal, the model that wrote
    it (``fallback_model`` when it names none), its usage and cached prompt tokens, and the
    limits ``announced`` with it. A completion with neither content nor refusal is refused as
    malformed (``ModelRejected``)."""
    choice = completion.choices[0] if completion.choices else None
    text = choice.message.content if choice is not None else None
    refusal = choice.message.refusal if choice is not None else None
    if not isinstance(text, str) and not isinstance(refusal, str):
        raise ModelRejected(
            f"model {fallback_model} sent a reply without choices[0].message.content "
            f"({'no choices' if choice is None else 'content ' + type(text).__name__})"
        )
    usage = completion.usage
    details = usage.prompt_tokens_details if usage is not None else None
    return Generation(
        (text or "").strip(), str(completion.model or fallback_model),
        usage.prompt_tokens if usage is not None else None,
        usage.completion_tokens if usage is not None else None,
        cached_tokens=details.cached_tokens if details is not None else None,
        refusal=refusal if isinstance(refusal, str) else None,
        announced=announced,
    )


class OpenAICompatibleModel(ProviderClient):
    """A model client answering through ``POST {base_url}/chat/completions``: the request's
    messages and parameters as sent (``max_tokens`` and ``temperature`` the endpoint's unless
    the request sets them), structured output as OpenAI's strict JSON schema
    (``response_format``), the model's refusal as ``Generation.refusal``, the cached prompt
    tokens (``usage.prompt_tokens_details.cached_tokens``) and the rate limits the answer's
    headers announce."""

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        name: str,
        api_key: SecretStr | None = None,
        *,
        timeout_seconds: float = 60.0,
        temperature: float | None = None,
        max_tokens: int = 1024,
    ) -> None:
        super().__init__(base_url, name, timeout_seconds=timeout_seconds, max_tokens=max_tokens)
        self.temperature = temperature
        key = api_key.get_secret_value() if api_key is not None else ""
        self._headers: dict[str, Any] = {} if key else {"Authorization": openai.Omit()}
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=key or NO_KEY, max_retries=0,
            timeout=openai.Timeout(timeout_seconds, connect=min(10.0, timeout_seconds)),
        )

    @property
    def sdk(self) -> openai.OpenAI:
        """The official SDK's client (never retrying), for the clients that share this one's
        address, key and failures (the batch client)."""
        return self._client

    @property
    def headers(self) -> dict[str, Any]:
        """The headers every request sends besides the SDK's (none but the Authorization
        header left out when no key is configured)."""
        return dict(self._headers)

    def body(self, request: Request) -> dict[str, Any]:
        """The chat-completions request body of ``request``, as sent (and as a batch line's
        body): the model, the messages, ``max_tokens`` and ``temperature`` the endpoint's
        unless the request sets them, the request's parameters and, for structured output,
        the ``response_format`` the SDK's ``parse`` sends (a strict JSON schema)."""
        body: dict[str, Any] = {
            "model": self.name,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": self.max_tokens,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(request.parameters.given())  # the request's own win over the endpoint's
        if request.output is not None:
            body["response_format"] = type_to_response_format_param(request.output)
        return body

    @contextmanager
    def asking(self, doing: str | None = None) -> Iterator[None]:
        """Turns the SDK's failures inside into ours, naming the model, where it is and what
        was being done (``doing``, when it is not a completion): no answer in time or no
        connection is ``ModelUnavailable``, an error status a refusal (``refusal``)."""
        what = f" ({doing})" if doing else ""
        try:
            yield
        except openai.APITimeoutError as exc:
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url}{what} did not answer within "
                f"{self.timeout_seconds:g} s ({type(exc).__name__})"
            ) from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url}{what} is unreachable: "
                f"{type(cause).__name__}: {cause}"
            ) from exc
        except openai.APIStatusError as exc:
            raise self.refusal(exc, doing) from exc

    def complete(self, request: Request) -> Generation:
        try:
            with self.asking():
                raw = self._client.chat.completions.with_raw_response.create(
                    extra_headers=self._headers, **self.body(request))
                completion: ChatCompletion = raw.parse()
        except (ValueError, openai.APIResponseValidationError) as exc:
            raise ModelRejected(
                f"model {self.name} sent a reply without choices[0].message.content: "
                f"{type(exc).__name__}: {str(exc)[:MAX_ERROR_BODY]}"
            ) from exc
        return generation_of(completion, self.name,
                             announced_limits(raw.headers, datetime.now(UTC)))

    def refusal(self, error: openai.APIStatusError,
                doing: str | None = None) -> ModelUnavailable | ModelRejected:
        """The provider answered with an error status: a refusal, transient (408, 429, 5xx:
        ``rate_limited`` for a 429, or a 503 naming a pause) or permanent (other 4xx)."""
        status = error.status_code
        who = f"model {self.name}" + (f" ({doing})" if doing else "")
        refused: ModelUnavailable | ModelRejected
        if transient_status(status):
            hint = pause_hint(error.response.headers)
            refused = ModelUnavailable(f"{who} answered HTTP {status}: {_snippet(error)}",
                                       retry_after=hint)
            refused.rate_limited = status == 429 or (status == 503 and hint is not None)
        else:
            refused = ModelRejected(f"{who} refused the request with HTTP {status}: "
                                    f"{_snippet(error)}")
        refused.status = status
        return refused

    def close(self) -> None:
        self._client.close()
