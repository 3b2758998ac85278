"""Dispatcher settings (RUNLEDGER_DELIVERY_*): the channels delivered and the limits every
channel shares; each channel's own fields are in its definition (``flows/channels.py``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.channel import Opening
from flows.channels import NAMES, channel_named
from flows.delivery.policy import RetryPolicy, UncertainPolicy
from flows.mail.settings import SmtpSettings, load_settings
from flows.transport import Transport


class DeliverySettings(BaseSettings):
    """Which channels are delivered, how long a claim lasts, and the retry limits."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_DELIVERY_", extra="ignore")

    channels: str = Field(
        default="email",
        description="The channels this deployment delivers, comma-separated: "
                    f"{', '.join(f'``{name}``' for name in NAMES)} (one dispatcher each, in one "
                    "flow run).")
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

    @field_validator("channels")
    @classmethod
    def _known_channels(cls, value: str) -> str:
        names = [c.strip() for c in value.split(",") if c.strip()]
        unknown = [c for c in names if c not in NAMES]
        if unknown or not names:
            raise ValueError(f"must list channels among {', '.join(NAMES)}, got {value!r}")
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
    """The transport of ``channel``, from its own settings (``smtp``, e.g. from a Prefect block,
    stands in for RUNLEDGER_SMTP_*)."""
    definition = channel_named(channel)
    return definition.open(load_settings(definition.settings),
                           Opening(settings.max_window_hours * 3600, smtp))
