"""what a job owes: obligations (per job and subject) and occurrences (skips and alerts)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 20:30:00

Reconcile compares what each job owes with the ledger: ``obligations`` records from which
period a job owes each subject, ``occurrences`` the durable decisions about one owed
(subject, period): skipped by the missed-run policy, reported overdue, recovered. New tables
only: no existing row changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "obligations",
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("subject", sa.String(length=500), nullable=False),
        sa.Column("owed_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job", "subject", name="pk_obligations"),
    )
    op.create_table(
        "occurrences",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("subject", sa.String(length=500), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.String(length=100), nullable=False),
        sa.Column("skipped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("skip_reason", sa.Text(), nullable=True),
        sa.Column("overdue_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("recovered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_occurrences"),
    )
    op.create_index("ix_occurrences_job_period", "occurrences", ["job", "period_start"])


def downgrade() -> None:
    op.drop_index("ix_occurrences_job_period", table_name="occurrences")
    op.drop_table("occurrences")
    op.drop_table("obligations")
