"""operational evidence: model calls per Attempt and Run, the flow run and task run that completed
a Run, and per job and day the Runs asked for again (duplicates suppressed)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 23:30:00

Operational evidence (issue 23): each Attempt records the model calls it made and each Run the
sum of its Attempts' calls; a completed Run records the flow run and task run that completed
it (its output location in Prefect's UI). Written by the existing complete and fail statements,
so no transition costs another round trip. ``suppressed_counts`` counts, per job and UTC day,
the Runs a tick asked for again that were completed or leased elsewhere (one upsert per tick).
New nullable or defaulted columns and a new table only: existing Runs read as 0 calls and no
recorded location.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("completed_flow_run_id", sa.String(length=36), nullable=True))
    op.add_column("runs", sa.Column("completed_task_run_id", sa.String(length=36), nullable=True))
    op.add_column("runs", sa.Column("model_calls", sa.Integer(), nullable=False,
                                    server_default="0"))
    op.add_column("attempts", sa.Column("model_calls", sa.Integer(), nullable=True))
    op.create_table(
        "suppressed_counts",
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("duplicates", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("in_progress_elsewhere", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job", "day", name="pk_suppressed_counts"),
    )


def downgrade() -> None:
    op.drop_table("suppressed_counts")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("model_calls")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("model_calls")
        batch_op.drop_column("completed_task_run_id")
        batch_op.drop_column("completed_flow_run_id")
