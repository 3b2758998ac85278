"""explicit revisions: a completed Run can be revised on purpose, as a new row of the same
identity with its revision number

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 03:00:00

A revision is a new ``runs`` row of the same (job, subject, period_start, version) with
``revision`` N > 0 (the original is 0), linked to the row it follows (``revises_run_id``), with
the operator's reason, whether its messages are queued again (``resend``) and the request it
came from (``requested_by``: the revise flow run).
The identity constraint gains ``revision``, so that revision N is inserted once whoever asks
(the guarded insert of ``request_revision`` relies on it). Every existing Run is revision 0 and
keeps its id. The revision columns are written on insert only: Run updates stay HOT. On
PostgreSQL the widened unique index is built under the ALTER TABLE's lock (writers wait for it):
upgrade a large ledger when no tick runs. SQLite recreates the table (batch mode).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

IDENTITY = ["job", "subject", "period_start", "version"]


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("revision", sa.Integer(), nullable=False,
                                      server_default="0"))
        batch_op.add_column(sa.Column("revises_run_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("revision_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("resend", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("requested_by", sa.String(length=300), nullable=True))
        batch_op.create_check_constraint(op.f("ck_runs_revision_non_negative"), "revision >= 0")
        batch_op.drop_constraint("uq_runs_identity", type_="unique")
        batch_op.create_unique_constraint("uq_runs_identity", [*IDENTITY, "revision"])


def downgrade() -> None:
    # Revisions cannot survive the old identity constraint (one row per identity).
    op.execute("DELETE FROM attempts WHERE run_id IN (SELECT run_id FROM runs WHERE revision > 0)")
    op.execute("DELETE FROM delivery_attempts WHERE message_id IN (SELECT message_id FROM outbox "
               "WHERE run_id IN (SELECT run_id FROM runs WHERE revision > 0))")
    op.execute("DELETE FROM outbox WHERE run_id IN (SELECT run_id FROM runs WHERE revision > 0)")
    op.execute("DELETE FROM runs WHERE revision > 0")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint("uq_runs_identity", type_="unique")
        batch_op.create_unique_constraint("uq_runs_identity", IDENTITY)
        batch_op.drop_constraint(op.f("ck_runs_revision_non_negative"), type_="check")
        batch_op.drop_column("requested_by")
        batch_op.drop_column("resend")
        batch_op.drop_column("revision_reason")
        batch_op.drop_column("revises_run_id")
        batch_op.drop_column("revision")
