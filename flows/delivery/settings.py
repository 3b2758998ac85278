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

    transport: Literal["smtp", "provider"] = Field(
        default="smtp", description="``smtp`` (RUNLEDGER_SMTP_*) or ``provider`` (an HTTP email "
                                    "API, RUNLEDGER_PROVIDER_*).")
    lease_seconds: float = Field(default=600.0, gt=0,
                                 description="How long a dispatcher holds a claimed message.")
    max_attempts: int = Field(default=8, ge=1,
                              description="Delivery attempts before a message is ``dead``.")
    base_delay_seconds: float = Field(
        default=30.0, gt=0,
        description="Backoff base: attempt n waits uniform(0, min(max, base * 2^(n-1))) seconds.")
    max_delay_seconds: float = Field(default=3600.0, gt=0,
                                     description="Longest wait between two attempts.")
    max_window_hours: float = Field(
        default=12.0, gt=0, description="Time from queueing after which a message is ``dead``.")
    uncertain: UncertainPolicy = Field(
        default=UncertainPolicy.RETRY,
        description="An ``uncertain`` message: ``retry`` it with the same key inside the window, "
                    "or ``hold`` it for an operator.")
    # Sent marks committed together (one commit per group; 1 = each before the next send). A crash
    # can resend at most this many accepted messages, each with its same Message-ID.
    mark_batch: int = Field(
        default=20, ge=1, le=500,
        description="Sent marks committed together; a crash can resend at most this many "
                    "accepted messages, each with its same Message-ID.")

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
