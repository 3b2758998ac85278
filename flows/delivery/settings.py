"""Dispatcher settings (RUNLEDGER_DELIVERY_*): the channels delivered, the email transport, the
limits, and the transport of each channel."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.delivery.policy import RetryPolicy, UncertainPolicy
from flows.errors import DeliveryConfigurationError
from flows.mail.provider import ProviderTransport
from flows.mail.settings import ProviderSettings, SmtpSettings, load_settings
from flows.mail.smtp import SmtpTransport
from flows.mail.transport import Transport
from store import CHANNELS


class DeliverySettings(BaseSettings):
    """Which transport delivers, how long a claim lasts, and the retry limits."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_DELIVERY_", extra="ignore")

    channels: str = Field(
        default="email",
        description="The channels this deployment delivers, comma-separated: ``email``, "
                    "``webhook``, ``object`` (one dispatcher each, in one flow run).")
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

    webhook_max_timeout: float = Field(
        default=30.0, gt=0, le=300,
        description="The longest timeout a webhook endpoint block may set; the delivery lease "
                    "must be at least four times it (a lookup and a POST).")
    object_timeout: float = Field(
        default=30.0, gt=0, le=300,
        description="Seconds to wait for each S3 request (PUT, HEAD).")

    @field_validator("channels")
    @classmethod
    def _known_channels(cls, value: str) -> str:
        names = [c.strip() for c in value.split(",") if c.strip()]
        unknown = [c for c in names if c not in CHANNELS]
        if unknown or not names:
            raise ValueError(f"must list channels among {', '.join(CHANNELS)}, got {value!r}")
        return ",".join(dict.fromkeys(names))

    @property
    def channel_list(self) -> list[str]:
        return self.channels.split(",")

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts, base_delay=self.base_delay_seconds,
            max_delay=self.max_delay_seconds, max_window=self.max_window_hours * 3600,
            uncertain=self.uncertain,
        )


def open_transport(settings: DeliverySettings, channel: str = "email",
                   smtp: SmtpSettings | None = None) -> Transport[Any]:
    """The transport of ``channel``: for email SMTP (``smtp`` given, e.g. from a Prefect block,
    or RUNLEDGER_SMTP_*) or the HTTP provider (RUNLEDGER_PROVIDER_*); for webhooks and objects
    the Prefect blocks each message's target names."""
    # Lazy imports: an email-only dispatcher (and the CLI) does not load boto3 or prefect-aws.
    if channel == "webhook":
        from flows.webhook.block import load_endpoint
        from flows.webhook.transport import WebhookTransport

        return WebhookTransport(load_endpoint, max_timeout=settings.webhook_max_timeout,
                                max_window_seconds=settings.max_window_hours * 3600)
    if channel == "object":
        from flows.objects.bucket import Bucket, load_bucket
        from flows.objects.transport import ObjectStoreTransport

        timeout = settings.object_timeout

        async def bucket(name: str) -> Bucket:
            return await load_bucket(name, timeout)

        return ObjectStoreTransport(bucket, timeout=timeout)
    if channel != "email":
        raise DeliveryConfigurationError(
            f"no transport for channel {channel!r}; RUNLEDGER_DELIVERY_CHANNELS lists among "
            f"{', '.join(CHANNELS)}")
    if settings.transport == "provider":
        return ProviderTransport(load_settings(ProviderSettings))
    return SmtpTransport(smtp or load_settings(SmtpSettings))
