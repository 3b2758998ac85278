"""Project settings shared by the pipeline and the models (RUNLEDGER_*); read when a flow run
starts, so a deployment's environment decides them, not the code that imported this module."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RunledgerSettings(BaseSettings):
    """Which model transforms, how long a lease lasts, and how hard the pipeline retries.

    ``model_call_log`` and ``offline_model_delay_seconds`` are test and diagnostic hooks: the
    first makes every model call append one JSON line (job, subject, run_id, pid, time) to a
    file, so calls can be counted across worker processes; the second makes the offline model
    sleep on each call, so a worker can be killed in the middle of a transform."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_", extra="ignore",
                                      protected_namespaces=())

    model: Literal["offline", "openai"] = Field(
        default="offline",
        description="``offline``: an extractive summarizer, no network; ``openai``: an "
                    "OpenAI-compatible chat-completions endpoint (vLLM, Ollama, ...).")
    model_base_url: str | None = Field(
        default=None, description="Base URL of the OpenAI-compatible API, e.g. "
                                  "``http://localhost:11434/v1`` (needed with ``openai``).")
    model_name: str | None = Field(
        default=None, description="Model name sent to that API, e.g. ``llama3.2`` (needed "
                                  "with ``openai``).")
    model_api_key: SecretStr | None = Field(
        default=None, description="API key sent as a bearer token; never logged.")
    model_api_key_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block holding the API key."
    )
    model_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Seconds to wait for one model answer.")
    model_call_log: Path | None = Field(
        default=None, description="Diagnostics: every model call appends one JSON line to "
                                  "this file.")
    offline_model_delay_seconds: float = Field(
        default=0.0, ge=0, description="Diagnostics: the offline model sleeps this long on "
                                       "each call.")

    lease_seconds: float | None = Field(
        default=None, gt=0, description="Overrides every job's lease duration (default 900 s)."
    )
    subject_concurrency: int = Field(default=8, ge=1, description="Subjects processed at once.")
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
