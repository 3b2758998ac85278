"""Named model endpoints: a Job names the endpoint its transform calls (``Job(endpoint=...)``),
and every job and worker naming it shares its limits. ``default`` is the RUNLEDGER_MODEL*
settings; another name is an entry of RUNLEDGER_ENDPOINTS, else a saved "runledger model
endpoint" Prefect block of that name (editable in the UI)."""

from __future__ import annotations

from dataclasses import dataclass

from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from pydantic import SecretStr, ValidationError

from flows.model.batch.protocol import BatchClient
from flows.model.client import misconfigured
from flows.model.errors import ModelMisconfigured
from flows.model.factory import (
    api_key,
    api_key_in_block,
    client_of,
    load_block,
    model_from_settings,
    prices_from_settings,
    prices_in_block,
)
from flows.model.protocol import ModelClient
from flows.model.providers import batch_client_class
from flows.prices import PriceList
from flows.settings import EndpointSettings, RunledgerSettings
from store import InvalidInput, Limits

DEFAULT = "default"


class ModelEndpoint(Block, EndpointSettings):
    """A model endpoint that jobs share: its kind of API (OpenAI-compatible or Anthropic's),
    URL, model, key, limits and prices."""

    _block_type_name = "runledger model endpoint"
    _block_type_slug = "runledger-model-endpoint"
    _description = ("A model endpoint runledger jobs share (Job(endpoint=\"<block name>\")): "
                    "its kind (openai or anthropic), base URL, model name, the Secret block "
                    "of its API key, the most tokens an answer may use, the requests and "
                    "tokens per minute and calls in flight its provider allows every worker "
                    "together, and the prices block of its model.")


class UnknownEndpoint(InvalidInput):
    """No model endpoint is configured under that name."""


@dataclass(frozen=True)
class Endpoint:
    """A model endpoint a tick calls: its name (what its calls and limits are recorded
    under), how to build its model, its limits (None: not limited, the offline model) and
    the model timeout (how long a call counts as in flight)."""

    name: str
    settings: RunledgerSettings
    given: EndpointSettings | None  # None: the RUNLEDGER_MODEL* settings

    @property
    def limits(self) -> Limits | None:
        """The shared limits; None for the offline model, which nothing limits."""
        if self.given is None:
            if self.settings.model == "offline":
                return None
            s = self.settings
            return Limits(s.model_requests_per_minute, s.model_tokens_per_minute,
                          s.model_max_concurrent)
        g = self.given
        return Limits(g.requests_per_minute, g.tokens_per_minute, g.max_concurrent)

    @property
    def batch_queue_tokens(self) -> int | None:
        """The prompt tokens its model may hold in batches in flight (None: no limit)."""
        if self.given is None:
            return self.settings.model_batch_queue_tokens
        return self.given.batch_queue_tokens

    @property
    def timeout_seconds(self) -> float:
        if self.given is not None and self.given.timeout_seconds is not None:
            return self.given.timeout_seconds
        return self.settings.model_timeout_seconds

    @property
    def max_tokens(self) -> int:
        if self.given is not None and self.given.max_tokens is not None:
            return self.given.max_tokens
        return self.settings.model_max_tokens

    def model(self) -> ModelClient:
        """A new client of this endpoint's model (the caller closes it)."""
        if self.given is None:
            return model_from_settings(self.settings)
        return client_of(self.given.kind, self.given.base_url, self.given.model_name,
                         self._given_key(),
                         timeout_seconds=self.timeout_seconds, max_tokens=self.max_tokens)

    def batch_client(self) -> BatchClient:
        """A new client of this endpoint's Batch API (the caller closes it); an endpoint
        without one is ``ModelMisconfigured``, naming the fix."""
        kind = self.settings.model if self.given is None else self.given.kind
        if kind == "offline":
            raise ModelMisconfigured(
                "a batch tick sends its calls through a provider's Batch API, and the offline "
                "model has none: set RUNLEDGER_MODEL=openai or anthropic (or name such an endpoint "
                "in Job(endpoint=...)), or run the job without batch")
        if self.given is None:
            base_url, name = self.settings.model_base_url, self.settings.model_name
            key = api_key(self.settings)
        else:
            base_url, name, key = self.given.base_url, self.given.model_name, self._given_key()
        assert base_url and name  # checked by endpoint_named
        return batch_client_class(kind)(base_url, name, key, timeout_seconds=self.timeout_seconds,
                                        max_tokens=self.max_tokens)

    def _given_key(self) -> SecretStr | None:
        assert self.given is not None
        named_by = f"endpoint {self.name}'s api_key_block"
        return (api_key_in_block(self.given.api_key_block, named_by)
                if self.given.api_key_block else None)

    def prices(self) -> PriceList:
        """The prices of its model: its prices block, else the RUNLEDGER_MODEL_PRICES ones."""
        if self.given is None or not self.given.prices_block:
            return prices_from_settings(self.settings)
        return prices_in_block(self.given.prices_block, f"endpoint {self.name}'s prices_block")


def endpoint_named(name: str, settings: RunledgerSettings) -> Endpoint:
    """The endpoint called ``name``: ``default``, an entry of RUNLEDGER_ENDPOINTS or a saved
    block; ``UnknownEndpoint`` (listing the known ones) otherwise. A configuration its client
    would refuse (no http(s) URL, no model name, an unknown kind) is ``ModelMisconfigured``,
    before anything is written. Reads, never writes."""
    if name == DEFAULT:
        return _checked(Endpoint(DEFAULT, settings, None))
    if name in settings.endpoints:
        return _checked(Endpoint(name, settings, settings.endpoints[name]))
    try:
        block = load_block(ModelEndpoint, name)
    except ValueError:
        known = [DEFAULT, *sorted(settings.endpoints), *_saved_blocks()]
        raise UnknownEndpoint(
            f"no model endpoint named {name!r}; known endpoints: {', '.join(known)} (add it to "
            "RUNLEDGER_ENDPOINTS or save a \"runledger model endpoint\" block of that name)"
        ) from None
    if not isinstance(block, ModelEndpoint):
        raise ModelMisconfigured(f"block {name!r} is not a \"runledger model endpoint\" block")
    try:
        given = EndpointSettings.model_validate(
            block.model_dump(include=set(EndpointSettings.model_fields)))
    except ValidationError as exc:
        raise ModelMisconfigured(f"block {name!r} is not a valid model endpoint: "
                                 f"{exc.errors()[0]['msg']}") from None
    return _checked(Endpoint(name, settings, given))


def _checked(endpoint: Endpoint) -> Endpoint:
    """``endpoint``, once its configuration reads as one its client takes."""
    given, settings = endpoint.given, endpoint.settings
    if given is not None:
        problem = misconfigured(given.kind, given.base_url, given.model_name,
                                (f"endpoint {endpoint.name}'s base_url",
                                 f"endpoint {endpoint.name}'s model_name"))
    elif settings.model != "offline":
        problem = misconfigured(settings.model, settings.model_base_url, settings.model_name,
                                ("RUNLEDGER_MODEL_BASE_URL", "RUNLEDGER_MODEL_NAME"))
    else:
        problem = None
    if problem is not None:
        raise ModelMisconfigured(problem)
    return endpoint


def _saved_blocks() -> list[str]:
    """The names of the saved endpoint blocks (none when the Prefect API cannot say)."""
    try:
        with get_client(sync_client=True) as client:
            found = client.read_block_documents_by_type(ModelEndpoint.get_block_type_slug())
    except Exception:  # an unknown block type or an unreachable API: nothing more to list
        return []
    return sorted(b.name for b in found if b.name)
