"""The email channel's definition: its RUNLEDGER_DELIVERY_TRANSPORT setting and its transport,
SMTP (RUNLEDGER_SMTP_*, or the deliver-outbox flow's SMTP block) or the HTTP provider
(RUNLEDGER_PROVIDER_*). An email's target is its address: it names no Prefect block."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.channel import Channel, Opening
from flows.mail.provider import ProviderTransport
from flows.mail.settings import ProviderSettings, SmtpSettings, load_settings
from flows.mail.smtp import SmtpTransport
from flows.transport import Transport
from store import EMAIL


class EmailDeliverySettings(BaseSettings):
    """Which transport delivers the email channel."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_DELIVERY_", extra="ignore")

    transport: Literal["smtp", "provider"] = Field(
        default="smtp", description="``smtp`` (RUNLEDGER_SMTP_*) or ``provider`` (an HTTP email "
                                    "API, RUNLEDGER_PROVIDER_*).")


def open_email(settings: EmailDeliverySettings, opening: Opening) -> Transport[Any]:
    """SMTP (the override, e.g. from a Prefect block, else RUNLEDGER_SMTP_*) or the provider."""
    if settings.transport == "provider":
        return ProviderTransport(load_settings(ProviderSettings))
    smtp = opening.override if isinstance(opening.override, SmtpSettings) else None
    return SmtpTransport(smtp or load_settings(SmtpSettings))


CHANNEL = Channel(name=EMAIL, settings=EmailDeliverySettings, open=open_email)
