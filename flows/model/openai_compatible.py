"""A client for OpenAI-compatible chat-completions endpoints (vLLM, Ollama, llama.cpp, OpenAI).

It never retries by itself: it classifies each failure so that the pipeline's task retries
(exponential backoff with jitter, bounded) decide. The API key is sent, never logged."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import SecretStr

from flows.model.errors import ModelMisconfigured, ModelRejected, ModelUnavailable
from flows.model.protocol import Generation
from flows.retry_after import retry_after_seconds

TRANSIENT_STATUSES = frozenset({408, 429})  # besides 5xx: the server asks to try again later
MAX_ERROR_BODY = 300


def _snippet(response: httpx.Response) -> str:
    text = response.text.strip().replace("\n", " ")
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
        self.temperature = temperature
        headers = {"Accept": "application/json"}
        if api_key is not None and api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {api_key.get_secret_value()}"
        self._client = httpx.Client(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=httpx.Timeout(timeout_seconds, connect=min(10.0, timeout_seconds)),
        )
        self.timeout_seconds = timeout_seconds

    def __repr__(self) -> str:
        return f"OpenAICompatibleModel(base_url={self.base_url!r}, name={self.name!r})"

    def generate(self, prompt: str, *, system: str | None = None) -> Generation:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        body: dict[str, Any] = {"model": self.name, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        try:
            response = self._client.post("chat/completions", json=body)
        except httpx.TimeoutException as exc:
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url} did not answer within "
                f"{self.timeout_seconds:g} s ({type(exc).__name__})"
            ) from exc
        except httpx.TransportError as exc:
            raise ModelUnavailable(
                f"model {self.name} at {self.base_url} is unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        return self._answer(response)

    def _answer(self, response: httpx.Response) -> Generation:
        status = response.status_code
        if status in TRANSIENT_STATUSES or status >= 500:
            raise ModelUnavailable(
                f"model {self.name} answered HTTP {status}: {_snippet(response)}",
                retry_after=retry_after_seconds(response.headers.get("Retry-After")),
            )
        if status >= 400:
            raise ModelRejected(f"model {self.name} refused the request with HTTP {status}: "
                                f"{_snippet(response)}")
        try:
            payload = response.json()
            choice = payload["choices"][0]
            text = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ModelRejected(
                f"model {self.name} sent a reply without choices[0].message.content: "
                f"{_snippet(response)}"
            ) from exc
        if not isinstance(text, str):
            raise ModelRejected(f"model {self.name} sent non-text content: {type(text).__name__}")
        return Generation(text.strip(), str(payload.get("model") or self.name))

    def close(self) -> None:
        self._client.close()
