"""Every outbox channel, listed once. A channel's folder exports its ``Channel`` definition;
adding a channel is its folder and its entry here (and its name and message rules in the
ledger's ``store/channels.py``, since the ledger checks a message when it is queued)."""

from __future__ import annotations

from typing import Any

from pydantic_settings import BaseSettings

from flows import mail, objects, webhook
from flows.channel import Channel
from flows.errors import DeliveryConfigurationError

# The order is the one people read: in CLI help, settings errors and `runledger check`.
CHANNELS: tuple[Channel[Any], ...] = (mail.CHANNEL, webhook.CHANNEL, objects.CHANNEL)
NAMES = tuple(c.name for c in CHANNELS)
# Checked with the other settings before any CLI command runs.
CHANNEL_SETTINGS: tuple[type[BaseSettings], ...] = tuple(c.settings for c in CHANNELS)


def channel_named(name: str) -> Channel[Any]:
    """The channel called ``name``; an unknown name is a configuration error."""
    for found in CHANNELS:
        if found.name == name:
            return found
    raise DeliveryConfigurationError(
        f"no transport for channel {name!r}; RUNLEDGER_DELIVERY_CHANNELS lists among "
        f"{', '.join(NAMES)}")
