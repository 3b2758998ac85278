"""Project settings shared by the pipeline and the models (RUNLEDGER_*); read when a flow run
starts, so a deployment's environment decides them, not the code that imported this module."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.prices import Currency, ModelPrice

# A field's json_schema_extra key: what leaving its variable unset means, for its error line.
UNSET = "unset"
_SECRET_WORDS = ("api_key", "secret", "password", "auth")


class EndpointLimits(BaseModel):
    """What a model endpoint allows, shared by every worker and job that calls it (none set:
    no limit, and the endpoint learns the provider's rate from its 429s)."""

    requests_per_minute: float | None = Field(
        default=None, gt=0, description="Requests per minute the provider allows, e.g. 1200.")
    tokens_per_minute: int | None = Field(
        default=None, gt=0, description="Tokens (prompt and completion) per minute it allows.")
    max_concurrent: int | None = Field(
        default=None, gt=0, description="Requests it allows in flight at once.")
    batch_queue_tokens: int | None = Field(
        default=None, gt=0, description="Prompt tokens its model may hold in batches in flight "
                                        "at once (the provider's enqueued-token limit, e.g. "
                                        "OpenAI's batch queue limit); a batch takes only what "
                                        "fits, the rest waits for the next poll.")


class EndpointSettings(EndpointLimits):
    """A named model endpoint: which kind of API (OpenAI-compatible or Anthropic's) and where,
    which model, whose key, its limits and its prices."""

    kind: Literal["openai", "anthropic"] = Field(
        default="openai", description="``openai``: an OpenAI-compatible chat-completions API; "
                                      "``anthropic``: Anthropic's Messages API.")
    base_url: str = Field(description="Base URL of the API, e.g. ``https://api.openai.com/v1`` "
                                      "or ``https://api.anthropic.com``.")
    model_name: str = Field(description="Model name sent to that API, e.g. ``gpt-4o-mini``.")
    api_key_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block holding the API key.")
    prices_block: str | None = Field(
        default=None, description="Name of a saved \"runledger model prices\" block "
                                  "(default: RUNLEDGER_MODEL_PRICES and its currency).")
    timeout_seconds: float | None = Field(
        default=None, gt=0, description="Seconds to wait for one answer (default: "
                                        "RUNLEDGER_MODEL_TIMEOUT_SECONDS).")
    max_tokens: int | None = Field(
        default=None, gt=0, description="The most tokens one answer may use, sent with every "
                                        "request (default: RUNLEDGER_MODEL_MAX_TOKENS).")


class RunledgerSettings(BaseSettings):
    """Which model transforms, how long a lease lasts, and how hard the pipeline retries.

    ``offline_model_delay_seconds`` is a test and diagnostic hook: the offline model sleeps on
    each call, so a worker can be killed in the middle of a transform. (Model calls are counted
    from the ledger, which records each one before it leaves.)"""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_", extra="ignore",
                                      protected_namespaces=())

    example_jobs: bool | None = Field(
        default=None,
        description="Register the example jobs shipped in ``flows/jobs`` (competitor-summary, "
                    "daily-credit). Default: yes in a checkout of runledger (an editable "
                    "install), no where runledger is installed from its wheel as a library, so "
                    "that a team's serve, reconcile and status see only its own jobs.")
    model: Literal["offline", "openai", "anthropic"] = Field(
        default="offline",
        description="``offline``: an extractive summarizer, no network; ``openai``: an "
                    "OpenAI-compatible chat-completions endpoint (vLLM, Ollama, ...); "
                    "``anthropic``: Anthropic's Messages API.")
    model_base_url: str | None = Field(
        default=None, description="Base URL of the API, e.g. ``http://localhost:11434/v1`` "
                                  "or ``https://api.anthropic.com`` (needed with ``openai`` "
                                  "and ``anthropic``).")
    model_name: str | None = Field(
        default=None, description="Model name sent to that API, e.g. ``llama3.2`` (needed "
                                  "with ``openai`` and ``anthropic``).")
    model_api_key: SecretStr | None = Field(
        default=None, description="API key sent as a bearer token; never logged.")
    model_api_key_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block holding the API key."
    )
    model_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Seconds to wait for one model answer.")
    model_max_tokens: int = Field(
        default=1024, gt=0, description="The most tokens one answer may use, sent with every "
        "request as ``max_tokens`` (the offline model stops there too): a budget reserves it, "
        "and the endpoint's tokens per minute take it, before each call leaves.")
    model_currency: Currency | None = Field(
        default=None, description="ISO 4217 code of RUNLEDGER_MODEL_PRICES' currency, e.g. "
                                  "``USD`` (needed with prices).")
    model_prices: dict[str, ModelPrice] = Field(
        default_factory=dict, description="Price per million input and output tokens per model "
        "name, as JSON: ``{\"gpt-4o-mini\": {\"input\": 0.15, \"output\": 0.6}}``; a model "
        "not listed shows its tokens and \"no price\".")
    model_prices_block: str | None = Field(
        default=None, description="Name of a saved \"runledger model prices\" Prefect block, "
                                  "read instead of RUNLEDGER_MODEL_PRICES (editable in the UI).")
    model_requests_per_minute: float | None = Field(
        default=None, gt=0, json_schema_extra={UNSET: "no limit, learned from 429s"},
        description="The default endpoint's requests per minute, shared "
                    "by every worker (none: learned from 429s).")
    model_tokens_per_minute: int | None = Field(
        default=None, gt=0, json_schema_extra={UNSET: "no limit"},
        description="The default endpoint's tokens per minute, shared by every worker.")
    model_batch_queue_tokens: int | None = Field(
        default=None, gt=0, json_schema_extra={UNSET: "no limit"},
        description="The default endpoint's enqueued-token limit for batches: prompt tokens its "
                    "model may hold in batches in flight at once (OpenAI's batch queue limit).")
    model_max_concurrent: int | None = Field(
        default=None, gt=0, json_schema_extra={UNSET: "no limit"},
        description="The default endpoint's requests in flight at once, shared by every "
                    "worker; also how many subjects a tick runs at once unless "
                    "RUNLEDGER_SUBJECT_CONCURRENCY is set.")
    model_refused_for_seconds: float = Field(
        default=300.0, gt=0, description="How long a call waits out an endpoint's refusals "
                                         "(429s and their pauses) before its subject ends as a "
                                         "transient failure, for reconcile to re-drive.")
    endpoints: dict[str, EndpointSettings] = Field(
        default_factory=dict, description="Named model endpoints a Job picks with "
        "``endpoint=\"name\"``, as JSON: ``{\"fast\": {\"base_url\": ..., \"model_name\": ..., "
        "\"requests_per_minute\": 600}}``; a name not here is looked up as a saved "
        "\"runledger model endpoint\" block. ``default`` is the RUNLEDGER_MODEL* settings.")
    offline_model_delay_seconds: float = Field(
        default=0.0, ge=0, description="Diagnostics: the offline model sleeps this long on "
                                       "each call.")

    lease_seconds: float | None = Field(
        default=None, gt=0, json_schema_extra={UNSET: "each job's own lease"},
        description="Overrides every job's lease duration (default 900 s).")
    approval_deadline_hours: float = Field(
        default=24.0, gt=0, description="How long a person has to approve or reject a held "
                                        "message before `runledger overdue` reports it (a job's "
                                        "Approval(deadline=...) wins).")
    subject_concurrency: int = Field(
        default=8, ge=1, description="Subjects processed at once; when not set, the job's "
                                     "endpoint's max concurrent (if it has one), else 8.")
    claim_batch: int = Field(
        default=500, ge=1, description="Subjects a tick registers and claims at once (one "
                                       "``register+claim`` task run); it claims the next batch "
                                       "when this one has ended.")
    task_retries: int = Field(default=3, ge=0, description="Retries of a transient stage failure.")
    retry_delay_seconds: float = Field(
        default=2.0, ge=0, description="First retry delay; doubles on each retry, with jitter."
    )
    reconcile_concurrency: int = Field(
        default=2, ge=1, description="Periods a reconcile pass runs at once (run-job subflows).")
    reconcile_cap: int = Field(
        default=1_000, ge=1, description="Owed occurrences one reconcile pass looks at per job.")
    reconcile_backoff_seconds: float = Field(
        default=60.0, ge=0, description="Wait before re-driving a stranded Run after its first "
                                        "attempt; doubles per attempt.")
    reconcile_max_backoff_seconds: float = Field(
        default=3600.0, ge=0, description="Longest wait between re-drives of a stranded Run.")
    max_retry_after_seconds: float = Field(
        default=60.0, ge=0, description="Longest wait honoured from a Retry-After answer."
    )
    batch_lease_seconds: float = Field(
        default=300.0, gt=0, description="How long a poller or submitter holds a batch (judged "
                                         "by the database clock): one that dies leaves it to "
                                         "the next poll after that long.")
    batch_deadline_seconds: float = Field(
        default=86_400.0, gt=0, description="How long past its tick's due time (or start, for a "
                                            "late tick) a batch call may wait for batches: a "
                                            "batch still running then is cancelled, and the "
                                            "calls it ends without are called synchronously.")
    batch_margin_seconds: float = Field(
        default=3_600.0, ge=0, description="The calls a batch ended without (expired, "
                                           "cancelled) go into a new batch while their deadline "
                                           "is further than this; nearer, they are called "
                                           "synchronously (most batches end within an hour).")

    @model_validator(mode="after")
    def _prices_have_a_currency(self) -> RunledgerSettings:
        if self.model_prices and self.model_currency is None:
            raise ValueError("RUNLEDGER_MODEL_PRICES needs RUNLEDGER_MODEL_CURRENCY, an ISO 4217 "
                             "code such as USD")
        return self


def settings_problems(error: ValidationError) -> list[str]:
    """One line per bad field of any settings class (RUNLEDGER_*, a job's own): the environment
    variable, the value given (a secret's left out), what is wrong, and what unsetting it means.
    Empty when ``error`` is not about a settings class."""
    kind = _settings_class(error.title)
    if kind is None:
        return []
    return [_problem(kind, dict(e)) for e in error.errors()]


def _settings_class(title: str) -> type[BaseSettings] | None:
    """The settings class called ``title`` (a ValidationError's title is its class's name)."""
    found: list[type[BaseSettings]] = [BaseSettings]
    while found:
        kind = found.pop()
        if kind.__name__ == title and kind is not BaseSettings:
            return kind
        found.extend(kind.__subclasses__())
    return None


def _problem(kind: type[BaseSettings], e: dict[str, Any]) -> str:
    wrong = str(e["msg"]).removeprefix("Value error, ").replace("Input should be", "must be")
    loc = [str(part) for part in e["loc"]]
    if not loc:  # a rule across fields: its message names the variables
        return wrong
    # A field with a validation alias (its variable's full name) is located by that alias.
    field = kind.model_fields.get(loc[0]) or next(
        (f for f in kind.model_fields.values() if f.validation_alias == loc[0]), None)
    alias = field.validation_alias if field is not None else None
    prefix = str(kind.model_config.get("env_prefix", ""))
    name = (alias if isinstance(alias, str) else f"{prefix}{loc[0]}").upper()
    if e["type"] == "missing":  # its "input" is every value given, secrets included
        what = (field.description or "") if field is not None else ""
        return f"{name}: must be set" + (f" ({what[:1].lower()}{what[1:].rstrip('.')})"
                                          if what else "")
    secret = (field is not None and "SecretStr" in str(field.annotation)) or any(
        word in part.lower() for part in loc for word in _SECRET_WORDS)
    if len(loc) > 1:  # inside a JSON value: the path to the bad entry
        where = "" if secret else f" ({'.'.join(loc[1:])}={e.get('input')!r})"
        return f"{name}{where}: {wrong}"
    given = "" if secret else f"={e.get('input')}"
    return f"{name}{given}: {wrong}{_unset(field)}"


def _unset(field: FieldInfo | None) -> str:
    """What leaving the variable unset gives: its hint, or its default."""
    extra = field.json_schema_extra if field is not None else None
    if isinstance(extra, dict) and UNSET in extra:
        return f" (or unset: {extra[UNSET]})"
    if field is None or field.is_required():
        return ""
    default = field.get_default(call_default_factory=True)
    return " (or unset)" if default is None or default in ({}, []) else \
        f" (or unset: {default})"
