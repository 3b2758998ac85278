"""What every provider's client shares: an address checked before anything is sent (a base
URL and a model name), and ``generate`` without a ledger."""

from __future__ import annotations

from typing import ClassVar, Literal

from flows.model.asking import Unrecorded
from flows.model.errors import ModelMisconfigured

Kind = Literal["openai", "anthropic"]
EXAMPLE_URLS: dict[Kind, str] = {"openai": "https://api.openai.com/v1",
                                 "anthropic": "https://api.anthropic.com"}


def misconfigured(kind: Kind, base_url: str | None, name: str | None,
                  settings: tuple[str, str]) -> str | None:
    """What is wrong with an endpoint's configuration, read without building its client
    (what a tick's preflight refuses before any Run is registered), naming ``settings``
    (those of its base URL and of its model name); None when nothing is."""
    url_setting, name_setting = settings
    if not base_url or not base_url.startswith(("http://", "https://")):
        return (f"{url_setting} must be an http(s) URL such as {EXAMPLE_URLS[kind]} for an "
                f"{kind} endpoint, got {base_url!r}")
    if not name:
        return f"{name_setting} must name the model of an {kind} endpoint"
    return None


class ProviderClient(Unrecorded):
    """A provider's client: its kind of API, the model it asks and where."""

    kind: ClassVar[Kind]

    def __init__(self, base_url: str, name: str, *, timeout_seconds: float,
                 max_tokens: int) -> None:
        problem = misconfigured(self.kind, base_url, name,
                                ("RUNLEDGER_MODEL_BASE_URL", "RUNLEDGER_MODEL_NAME"))
        if problem is not None:
            raise ModelMisconfigured(problem)
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.endpoint = self.base_url
        self.max_tokens = max_tokens
        self.timeout_seconds = timeout_seconds

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, name={self.name!r})"
