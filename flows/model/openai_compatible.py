"""A client for OpenAI-compatible chat-completions endpoints (vLLM, Ollama, LiteLLM's proxy,
llama.cpp, OpenAI), on the official ``openai`` SDK.

The SDK never retries (``max_retries=0``): each failure is classified so that the pipeline
decides, and every request that leaves is one model call the ledger recorded. A 429 (or a 503
with a pause hint: Retry-After, x-ratelimit-reset-*) is ``rate_limited``: the endpoint's
limiter pauses every worker and tries the call again; other transient failures go to the
stage's retries. The API key is sent, never logged."""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from pydantic import SecretStr

from flows.model.errors import ModelMisconfigured, ModelRejected, ModelUnavailable
from flows.model.protocol import Generation
from flows.retry_after import pause_hint

TRANSIENT_STATUSES = frozenset({408, 429})  # besides 5xx: the server asks to try again later
MAX_ERROR_BODY = 300
# The SDK wants a key; local servers want none: this placeholder is never sent (the request
# omits its Authorization header when no key is configured).
NO_KEY = "no-key"


def _snippet(error: openai.APIStatusError) -> str:
    text = error.response.text.strip().replace("\n", " ")
    return text[:MAX_ERROR_BODY] + ("..." if len(text) > MAX_ERROR_BODY else "")


class OpenAICompatibleModel:
    """A Model answering through ``POST {base_url}/chat/completions``."""

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
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ModelMisconfigured(
                f"RUNLEDGER_MODEL_BASE_URL must be an http(s) URL such as "
                f"http://localhost:11434/v1, got {base_url!r}"
            )
        if not name:
            raise ModelMisconfigured("RUNLEDGER_MODEL_NAME must name the model, e.g. llama3.2")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.endpoint = self.base_url
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_seconds = timeout_seconds
        key = api_key.get_secret_value() if api_key is not None else ""
        self._headers: dict[str, Any] = {} if key else {"Authorization": openai.Omit()}
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=key or NO_KEY, max_retries=0,
            timeout=openai.Timeout(timeout_seconds, connect=min(10.0, timeout_seconds)),
        )

    def __repr__(self) -> str:
        return f"OpenAICompatibleModel(base_url={self.base_url!r}, name={self.name!r})"

    def generate(self, prompt: str, *, system: str | None = None) -> Generation:
        messages: list[ChatCompletionMessageParam] = (
            [{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": prompt})
        options: dict[str, Any] = {}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        try:
            completion = self._client.chat.completions.create(
                model=self.name, messages=messages, max_tokens=self.max_tokens,
                extra_headers=self._headers, **options)
        except openai.APITimeoutError as exc:
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url} did not answer within "
                f"{self.timeout_seconds:g} s ({type(exc).__name__})"
            ) from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url} is unreachable: "
                f"{type(cause).__name__}: {cause}"
            ) from exc
        except openai.APIStatusError as exc:
            raise self._refusal(exc) from exc
        except (ValueError, openai.APIResponseValidationError) as exc:
            raise ModelRejected(
                f"model {self.name} sent a reply without choices[0].message.content: "
                f"{type(exc).__name__}: {str(exc)[:MAX_ERROR_BODY]}"
            ) from exc
        return self._answer(completion)

    def _refusal(self, error: openai.APIStatusError) -> ModelUnavailable | ModelRejected:
        """The provider answered with an error status: a refusal, transient or permanent."""
        status = error.status_code
        refused: ModelUnavailable | ModelRejected
        if status in TRANSIENT_STATUSES or status >= 500:
            hint = pause_hint(error.response.headers)
            refused = ModelUnavailable(
                f"model {self.name} answered HTTP {status}: {_snippet(error)}",
                retry_after=hint)
            refused.rate_limited = status == 429 or (status == 503 and hint is not None)
        else:
            refused = ModelRejected(f"model {self.name} refused the request with HTTP {status}: "
                                    f"{_snippet(error)}")
        refused.status = status
        return refused

    def _answer(self, completion: ChatCompletion) -> Generation:
        choice = completion.choices[0] if completion.choices else None
        text = choice.message.content if choice is not None else None
        if not isinstance(text, str):
            raise ModelRejected(
                f"model {self.name} sent a reply without choices[0].message.content "
                f"({'no choices' if choice is None else 'content ' + type(text).__name__})"
            )
        usage = completion.usage
        return Generation(
            text.strip(), str(completion.model or self.name),
            usage.prompt_tokens if usage is not None else None,
            usage.completion_tokens if usage is not None else None,
        )

    def close(self) -> None:
        self._client.close()
