"""The webhook channel: a signed JSON ``POST`` with the message's stable key as
``Idempotency-Key``, per-endpoint settings from a Prefect block, and the receiver's status
lookup that settles an uncertain delivery without a second ``POST``. Exports the channel's
definition."""

from flows.webhook.channel import CHANNEL

__all__ = ["CHANNEL"]
