"""held messages: outbox rows a person approves or rejects before they are delivered

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 18:30:00

A job with an approval (issue 49) queues its messages ``held``: the dispatcher never claims
one (``held`` is not in the claimable index's predicate). A person's decision moves it to
``pending`` (approved: delivered by the ordinary pass, with its key) or to ``rejected`` (never
sent), and the row records who decided, when, why (``decided_by``, ``decided_at``,
``decision``, ``decision_reason``); ``hold_until`` is when an unanswered hold is overdue.
Nullable columns only: every existing row reads as it did.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.check_edits import replace_check

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

OLD = ("pending", "sending", "sent", "retry", "uncertain", "dead")
NEW = (*OLD, "held", "rejected")


def upgrade() -> None:
    # Columns only: no table rebuild (on SQLite one fails on the delivery attempts' foreign
    # keys once a message was tried).
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hold_until", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("decision", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("decided_by", sa.String(length=300), nullable=True))
        batch_op.add_column(sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("decision_reason", sa.Text(), nullable=True))
    replace_check("outbox", "status", "ck_outbox_status", OLD, NEW)


def downgrade() -> None:
    # The older schema cannot hold a message back: held and rejected rows cannot be kept.
    op.execute("DELETE FROM delivery_attempts WHERE message_id IN "
               "(SELECT message_id FROM outbox WHERE status IN ('held', 'rejected'))")
    op.execute("DELETE FROM outbox WHERE status IN ('held', 'rejected')")
    replace_check("outbox", "status", "ck_outbox_status", NEW, OLD)
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        for column in ("decision_reason", "decided_at", "decided_by", "decision", "hold_until"):
            batch_op.drop_column(column)
