"""The fence guard: every worker write to a fenced table (a Run under its lease, an outbox
message under its delivery lease, a model call under its Attempt's lease) changes a row only
while the writer still holds it, judged in the statement itself. One guard, written once: a
table names its key, fence, owner and status columns and the status that means held."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from store.models import outbox_table, runs_table
from store.statement import param


@dataclass(frozen=True)
class Fenced:
    """A fenced table as its guard reads it: the row ``key``, its ``fence`` and ``owner``
    columns, and its ``status`` column with the value ``held`` while a lease holds the row."""

    key: sa.Column[Any]
    fence: sa.Column[Any]
    owner: sa.Column[Any]
    status: sa.Column[Any]
    held: str

    def holder(self, *, key: Any = None, fence: Any = None, owner: Any = None,
               status: Any = None) -> sa.ColumnElement[bool]:
        """The row is held under exactly this fence and owner: each compared with its
        parameter (``key``'s name, ``fence``, ``owner``) unless an expression is given; a
        ``status`` expression stands for the column where a plan needs it written otherwise."""
        return sa.and_(
            self.key == (param(self.key) if key is None else key),
            self.fence == (param(self.fence, "fence") if fence is None else fence),
            self.owner == (param(self.owner, "owner") if owner is None else owner),
            (self.status if status is None else status) == self.held,
        )

    def presented(self, key: str, fence: int, owner: str) -> dict[str, Any]:
        """The parameters of ``holder()`` for a claim on row ``key``."""
        return {self.key.key: key, "fence": fence, "owner": owner}


RUN_LEASE = Fenced(runs_table.c.run_id, runs_table.c.fence, runs_table.c.owner,
                   runs_table.c.status, "running")
DELIVERY_LEASE = Fenced(outbox_table.c.message_id, outbox_table.c.fence,
                        outbox_table.c.lease_owner, outbox_table.c.status, "sending")


def run_held(fence: Any = None) -> sa.ColumnElement[bool]:
    """The Run of the claim presented is held (its fence: the parameter, or ``fence``): the
    guard of a write to a table fenced by its Run's lease (model calls), as a subquery."""
    return sa.exists(sa.select(RUN_LEASE.key).where(RUN_LEASE.holder(fence=fence)))
