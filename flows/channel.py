"""What a channel is to the code: one ``Channel`` definition, exported by the channel's folder
(``flows/mail``, ``flows/webhook``, ``flows/objects``) and listed once in ``flows/channels.py``.
The job API asks it which Prefect block a target names and whether that block can be used; the
delivery deployment asks it for its settings and its transport."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from pydantic_settings import BaseSettings

from flows.lazy import loaded
from flows.transport import Transport

S = TypeVar("S", bound=BaseSettings)


@dataclass(frozen=True)
class Opening:
    """What the delivery deployment hands a channel's opener: its retry window, and transport
    settings its caller chose instead of the environment's (the deliver-outbox flow's SMTP
    block), or None."""

    max_window_seconds: float
    override: BaseModel | None = None


@dataclass(frozen=True)
class TargetBlock:
    """The Prefect block a channel's targets name: its kind in words, its block class as
    ``module:class`` (imported when a target is first checked), and the check that a loaded block
    is usable (raising ``DeliveryConfigurationError`` if not)."""

    kind: str
    block_class: str
    check: Callable[[str, Any], None]

    def block_type(self) -> type[Any]:
        """The block class, its module imported if it is not yet."""
        found: type[Any] = loaded(self.block_class)
        return found


def no_block(target: str) -> None:
    """A channel whose targets name no Prefect block (an email's is its address)."""
    return None


@dataclass(frozen=True)
class Channel(Generic[S]):
    """One outbox channel: ``name`` as the outbox stores it, ``settings`` (its own
    RUNLEDGER_DELIVERY_* fields, loaded by the delivery deployment), ``open`` (its transport for
    one delivery pass, from those settings), ``block_of`` (the block a message's target names,
    or None), ``block`` (how that block is checked)."""

    name: str
    settings: type[S]
    open: Callable[[S, Opening], Transport[Any]]
    block_of: Callable[[str], str | None] = no_block
    block: TargetBlock | None = None
