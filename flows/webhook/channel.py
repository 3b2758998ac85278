"""The webhook channel's definition: its RUNLEDGER_DELIVERY_WEBHOOK_MAX_TIMEOUT setting, its
target (the name of a "runledger webhook endpoint" block, usable when its URL is https or
loopback) and its transport."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.channel import Channel, Opening, TargetBlock
from flows.transport import Transport
from flows.webhook.block import WebhookEndpoint, endpoint_settings, load_endpoint
from flows.webhook.transport import WebhookTransport
from store import WEBHOOK


class WebhookDeliverySettings(BaseSettings):
    """The longest timeout a webhook endpoint block may set."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_DELIVERY_", extra="ignore")

    webhook_max_timeout: float = Field(
        default=30.0, gt=0, le=300,
        description="The longest timeout a webhook endpoint block may set; the delivery lease "
                    "must be at least four times it (a lookup and a POST).")


def open_webhook(settings: WebhookDeliverySettings, opening: Opening) -> Transport[Any]:
    """POSTs to the endpoint blocks each message's target names."""
    return WebhookTransport(load_endpoint, max_timeout=settings.webhook_max_timeout,
                            max_window_seconds=opening.max_window_seconds)


def check_endpoint_block(name: str, found: WebhookEndpoint) -> None:
    """Its URL rules (the secret is read at delivery)."""
    endpoint_settings(name=name, url=found.url, lookup_url=found.lookup_url,
                      key_retention_hours=found.key_retention_hours, timeout=found.timeout)


def endpoint_of(target: str) -> str:
    """A webhook's target is its endpoint block's name."""
    return target


CHANNEL = Channel(
    name=WEBHOOK, settings=WebhookDeliverySettings, open=open_webhook, block_of=endpoint_of,
    block=TargetBlock("webhook endpoint", "flows.webhook.block:WebhookEndpoint",
                      check_endpoint_block))
