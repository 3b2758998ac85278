"""decision events: whether each reconcile decision's event is known to have been emitted, and
the give-up decision on its occurrence

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 00:00:00

A reconcile pass killed between a decision's commit (skip, overdue, recovered, give-up) and its
event lost that event for good: the next pass took nothing new and emitted nothing. Each
decision now has an ``*_emitted_at`` column on its occurrence, set once its event was handed to
the Prefect server; a pass emits every decision whose column is empty (its own and any a dead
pass left), under a short lease (``emitting_until``) so that two passes do not emit at once.
A give-up is recorded on its occurrence too (``gave_up_at``). The decisions made before this
revision are taken as emitted (the old code emitted them right after the commit), so upgrading
does not re-send old alerts. Nullable columns only.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

COLUMNS = ("gave_up_at", "skip_emitted_at", "overdue_emitted_at", "recovered_emitted_at",
           "gave_up_emitted_at", "emitting_until")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("occurrences", sa.Column(name, sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE occurrences SET skip_emitted_at = skipped_at, "
               "overdue_emitted_at = overdue_at, recovered_emitted_at = recovered_at")


def downgrade() -> None:
    with op.batch_alter_table("occurrences", schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
