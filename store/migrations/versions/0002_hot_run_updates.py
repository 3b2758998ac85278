"""runs: every Run update a HOT update (no index on status; free room in each page)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 05:30:00

A claim, an input save and a completion each update the Run row. An index on ``status``
made those updates insert into every index of the table; without it (listing by job still
uses the identity index, which starts with ``job``) and with pages filled to 60 % on
PostgreSQL, the new row version stays on its page and no index is touched.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_job_status")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE runs SET (fillfactor = 60)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE runs RESET (fillfactor)")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_job_status", ["job", "status"], unique=False)
