"""Approval: a job's messages wait for a person before they go out. Its Runs complete as
always (output stored, model paid once), but the outbox rows they queue are ``held``: the
dispatcher never sends one until a person approves it (``runledger outbox approve``, or the
review-outbox flow run's form in the Prefect UI); a rejected one is never sent."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Literal, get_args

from flows.errors import InvalidJob
from store import CHANNELS, OutboxMessage

OnDeadline = Literal["wait", "reject"]


@dataclass(frozen=True, kw_only=True)
class Approval:
    """Which of a job's messages a person approves, and what an unanswered hold becomes.

    Attributes:
        channels: the channels held for approval (``email``, ``webhook``, ``object``); default:
            every channel.
        deadline: how long a person has to decide before the hold is overdue (reported by
            ``runledger overdue``); default: RUNLEDGER_APPROVAL_DEADLINE_HOURS.
        on_deadline: what an overdue hold becomes: ``wait`` (still held, reported overdue until
            someone decides) or ``reject`` (rejected by the deadline, never sent).
    """

    channels: tuple[str, ...] = CHANNELS
    deadline: timedelta | None = None
    on_deadline: OnDeadline = "wait"

    def __post_init__(self) -> None:
        if isinstance(self.channels, str) or not self.channels \
                or not set(self.channels) <= set(CHANNELS):
            raise InvalidJob(f"approval channels must be a non-empty tuple of "
                             f"{', '.join(CHANNELS)}, got {self.channels!r}")
        if self.deadline is not None and (not isinstance(self.deadline, timedelta)
                                          or self.deadline <= timedelta(0)):
            raise InvalidJob(f"approval deadline must be a positive timedelta (or None: "
                             f"RUNLEDGER_APPROVAL_DEADLINE_HOURS), got {self.deadline!r}")
        if self.on_deadline not in get_args(OnDeadline):
            raise InvalidJob(f"approval on_deadline must be one of "
                             f"{', '.join(get_args(OnDeadline))}, got {self.on_deadline!r}")

    def hold(self, messages: list[OutboxMessage], default_deadline: timedelta
             ) -> list[OutboxMessage]:
        """The messages, those of a held channel marked to wait for a person."""
        deadline = self.deadline or default_deadline
        return [replace(m, hold=deadline) if m.channel in self.channels else m for m in messages]
