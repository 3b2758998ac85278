"""Where a job's messages go (its Targets), and whether the blocks they name can be used: a
webhook endpoint block whose URL is https (or loopback), an S3Bucket block whose endpoint URL
is. A tick checks its job's targets before its first model call (flows/run_job/preflight.py);
a completion checks the blocks its messages name before it queues them (``check_targets``),
so a block deleted or broken since is refused with nothing written. A block found usable once
is remembered for the process (one broken later is a configuration error at delivery)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prefect.exceptions import ObjectNotFound
from prefect_aws import S3Bucket

from flows.errors import DeliveryConfigurationError
from flows.objects.bucket import check_endpoint
from flows.webhook.block import WebhookEndpoint, endpoint_settings
from store import (
    EMAIL,
    OBJECT,
    WEBHOOK,
    InvalidInput,
    OutboxMessage,
    check_block_name,
    split_object_target,
)

_USABLE: set[Target] = set()
SEE = "see docs/how-to/outbox.md"


class MissingBlock(InvalidInput):
    """A target names a Prefect block that does not exist; nothing was written."""


class InvalidBlock(InvalidInput):
    """A target names a Prefect block that exists but cannot be used (a plain-http URL off
    loopback, a block of another type); nothing was written."""


@dataclass(frozen=True)
class Target:
    """One place a job's messages go: email, or a webhook endpoint or S3Bucket block by name."""

    channel: str
    block: str | None = None

    @classmethod
    def email(cls) -> Target:
        """Emails to the addresses its messages name (the delivery's mail transport)."""
        return cls(EMAIL)

    @classmethod
    def webhook(cls, block: str) -> Target:
        """JSON POSTs to the "runledger webhook endpoint" block called ``block``."""
        return cls(WEBHOOK, check_block_name(block, "a webhook target's endpoint block"))

    @classmethod
    def object(cls, block: str) -> Target:
        """Reports written to the bucket of the prefect-aws S3Bucket block called ``block``."""
        return cls(OBJECT, check_block_name(block, "an object target's bucket block"))

    def describe(self) -> str:
        return self.channel if self.block is None else f"{self.channel} {self.block}"


def message_target(message: OutboxMessage) -> Target:
    """The Target an outbox message goes to."""
    if message.channel == WEBHOOK:
        return Target(WEBHOOK, message.recipient)
    if message.channel == OBJECT:
        return Target(OBJECT, split_object_target(message.recipient)[0])
    return Target.email()


def check_target(target: Target) -> None:
    """A webhook or object target's block exists (``MissingBlock``) and is usable
    (``InvalidBlock``); an email target names none."""
    if target.block is None or target in _USABLE:
        return
    kind = "webhook endpoint" if target.channel == WEBHOOK else "S3Bucket"
    block_type: Any = WebhookEndpoint if target.channel == WEBHOOK else S3Bucket
    try:
        # Synchronously: Block.load dispatches on its context, and in a tick's thread (inside
        # an async flow run) it would return a coroutine.
        found: object = block_type.load(target.block, _sync=True)
    except (ValueError, ObjectNotFound) as exc:
        raise MissingBlock(
            f"the {kind} block {target.block!r} does not exist; create it ({SEE}) or fix the "
            "job's targets and messages. Nothing was written") from exc
    try:
        if isinstance(found, WebhookEndpoint):  # its URL rules (the secret is read at delivery)
            endpoint_settings(name=target.block, url=found.url, lookup_url=found.lookup_url,
                              key_retention_hours=found.key_retention_hours,
                              timeout=found.timeout)
        elif isinstance(found, S3Bucket):
            params = found.credentials.aws_client_parameters.get_params_override()
            check_endpoint(target.block, params.get("endpoint_url"))
        else:
            raise DeliveryConfigurationError(
                f"block {target.block!r} is a {type(found).__name__}, not a {kind} block")
    except DeliveryConfigurationError as exc:
        raise InvalidBlock(f"{exc}; fix the block ({SEE}). Nothing was written") from None
    _USABLE.add(target)


def check_targets(messages: Iterable[OutboxMessage]) -> None:
    """Refuse messages whose webhook endpoint or S3Bucket block is missing or unusable."""
    for target in dict.fromkeys(message_target(m) for m in messages):
        check_target(target)
