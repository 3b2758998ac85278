"""Dispatcher settings (RUNLEDGER_DELIVERY_*) and the transport they select."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.delivery.policy import RetryPolicy, UncertainPolicy
from flows.mail.provider import ProviderTransport
from flows.mail.settings import ProviderSettings, SmtpSettings, load_settings
from flows.mail.smtp import SmtpTransport
from flows.mail.transport import Transport


class DeliverySettings(BaseSettings):
    """Which transport delivers, how long a claim lasts, and the retry limits."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_DELIVERY_", extra="ignore")

    transport: Literal["smtp", "provider"] = "smtp"
    lease_seconds: float = Field(default=600.0, gt=0)
    max_attempts: int = Field(default=8, ge=1)
    base_delay_seconds: float = Field(default=30.0, gt=0)
    max_delay_seconds: float = Field(default=3600.0, gt=0)
    max_window_hours: float = Field(default=12.0, gt=0)
    uncertain: UncertainPolicy = UncertainPolicy.RETRY
    # Sent marks committed together (one commit per group; 1 = each before the next send). A crash
    # can resend at most this many accepted messages, each with its same Message-ID.
    mark_batch: int = Field(default=20, ge=1, le=500)

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts, base_delay=self.base_delay_seconds,
            max_delay=self.max_delay_seconds, max_window=self.max_window_hours * 3600,
            uncertain=self.uncertain,
        )


def open_transport(settings: DeliverySettings, smtp: SmtpSettings | None = None) -> Transport:
    """The configured transport: SMTP (``smtp`` given, e.g. from a Prefect block, or
    RUNLEDGER_SMTP_*) or the HTTP provider (RUNLEDGER_PROVIDER_*)."""
    if settings.transport == "provider":
        return ProviderTransport(load_settings(ProviderSettings))
    return SmtpTransport(smtp or load_settings(SmtpSettings))
