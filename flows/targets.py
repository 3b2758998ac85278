"""Before a completion queues its messages: every block a webhook or object message names must
exist (and a webhook endpoint's URL be https off loopback), or the completion is refused with
the block's name and nothing is written. A name found
once is remembered for the process (a block deleted later is a configuration error at
delivery)."""

from __future__ import annotations

from collections.abc import Iterable

from prefect.blocks.core import Block
from prefect.exceptions import ObjectNotFound
from prefect_aws import S3Bucket

from flows.errors import DeliveryConfigurationError
from flows.webhook.block import WebhookEndpoint, endpoint_settings
from store import InvalidInput, OutboxMessage, split_object_target

_FOUND: set[tuple[str, str]] = set()


class MissingBlock(InvalidInput):
    """A message names a Prefect block that does not exist or is invalid; nothing was written."""


def _needed(messages: Iterable[OutboxMessage]) -> dict[tuple[str, str], type[Block]]:
    needed: dict[tuple[str, str], type[Block]] = {}
    for message in messages:
        if message.channel == "webhook":
            needed[("webhook endpoint", message.recipient)] = WebhookEndpoint
        elif message.channel == "object":
            needed[("S3Bucket", split_object_target(message.recipient)[0])] = S3Bucket
    return needed


def check_targets(messages: Iterable[OutboxMessage]) -> None:
    """Refuse messages whose webhook endpoint or S3Bucket block does not exist."""
    for (kind, name), block in _needed(messages).items():
        if (kind, name) in _FOUND:
            continue
        try:
            found = block.load(name)
        except (ValueError, ObjectNotFound) as exc:
            raise MissingBlock(
                f"a message names the {kind} block {name!r}, which does not exist; create it "
                f"(see docs/how-to/outbox.md) or fix the job's messages. Nothing was written"
            ) from exc
        if isinstance(found, WebhookEndpoint):
            try:  # the URL and lookup rules (the secret is read at delivery only)
                endpoint_settings(name=name, url=found.url, lookup_url=found.lookup_url,
                                  key_retention_hours=found.key_retention_hours,
                                  timeout=found.timeout)
            except DeliveryConfigurationError as exc:
                raise MissingBlock(f"{exc}. Nothing was written") from None
        _FOUND.add((kind, name))
