"""Where a job's messages go (its Targets), and whether the blocks they name can be used: a
webhook endpoint block whose URL is https (or loopback), an S3Bucket block whose endpoint URL
is. A tick checks its job's targets before its first model call (flows/run_job/preflight.py);
a completion checks the blocks its messages name before it queues them (``check_targets``),
so a block deleted or broken since is refused with nothing written. A block found usable once
is remembered for the process (one broken later is a configuration error at delivery)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prefect.exceptions import ObjectNotFound

from flows.channels import channel_named
from flows.errors import DeliveryConfigurationError
from store import EMAIL, OBJECT, WEBHOOK, InvalidInput, OutboxMessage, check_block_name

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
    return Target(message.channel, channel_named(message.channel).block_of(message.recipient))


def check_target(target: Target) -> None:
    """A target's block, if its channel names one, exists (``MissingBlock``) and is usable
    (``InvalidBlock``)."""
    block = channel_named(target.channel).block
    if target.block is None or block is None or target in _USABLE:
        return
    block_type = block.block_type()
    try:
        # Synchronously: Block.load dispatches on its context, and in a tick's thread (inside
        # an async flow run) it would return a coroutine.
        found: object = block_type.load(target.block, _sync=True)
    except (ValueError, ObjectNotFound) as exc:
        raise MissingBlock(
            f"the {block.kind} block {target.block!r} does not exist; create it ({SEE}) or fix "
            "the job's targets and messages. Nothing was written") from exc
    try:
        if not isinstance(found, block_type):
            raise DeliveryConfigurationError(
                f"block {target.block!r} is a {type(found).__name__}, not a {block.kind} block")
        block.check(target.block, found)
    except DeliveryConfigurationError as exc:
        raise InvalidBlock(f"{exc}; fix the block ({SEE}). Nothing was written") from None
    _USABLE.add(target)


def check_targets(messages: Iterable[OutboxMessage]) -> None:
    """Refuse messages whose webhook endpoint or S3Bucket block is missing or unusable."""
    for target in dict.fromkeys(message_target(m) for m in messages):
        check_target(target)
