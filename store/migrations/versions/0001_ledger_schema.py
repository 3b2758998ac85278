"""ledger schema: runs, attempts, outbox, delivery_attempts

Revision ID: 0001
Revises:
Create Date: 2026-11-30 04:52:30.271426
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("subject", sa.String(length=500), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.String(length=100), nullable=False),
        sa.Column("params_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("params", JSON_DOC, nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=300), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("raw_input", JSON_DOC, nullable=True),
        sa.Column("output", JSON_DOC, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("completed_attempt_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'failed')", name=op.f("ck_runs_status")
        ),
        sa.CheckConstraint("fence >= 0", name=op.f("ck_runs_fence_non_negative")),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
        sa.UniqueConstraint("job", "subject", "period_start", "version", name="uq_runs_identity"),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_job_status", ["job", "status"], unique=False)

    op.create_table(
        "attempts",
        sa.Column("attempt_id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=300), nullable=False),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('completed', 'released', 'failed', 'expired')",
            name=op.f("ck_attempts_outcome"),
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_attempts_run_id_runs")),
        sa.PrimaryKeyConstraint("attempt_id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("run_id", "fence", name="uq_attempts_run_fence"),
    )
    op.create_table(
        "outbox",
        sa.Column("message_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("channel", sa.String(length=32), nullable=False),
        sa.Column("recipient", sa.String(length=320), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("headers", JSON_DOC, nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=300), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("provider_message_id", sa.String(length=300), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'sending', 'sent', 'retry', 'uncertain', 'dead')",
            name=op.f("ck_outbox_status"),
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_outbox_run_id_runs")),
        sa.PrimaryKeyConstraint("message_id", name=op.f("pk_outbox")),
        sa.UniqueConstraint(
            "run_id", "channel", "recipient", name="uq_outbox_run_channel_recipient"
        ),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_due", ["status", "next_attempt_at"], unique=False)

    op.create_table(
        "delivery_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=300), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reply_code", sa.Integer(), nullable=True),
        sa.Column("reply_text", sa.Text(), nullable=True),
        sa.Column("provider_message_id", sa.String(length=300), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('sent', 'retry', 'uncertain', 'dead')",
            name=op.f("ck_delivery_attempts_outcome"),
        ),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["outbox.message_id"],
            name=op.f("fk_delivery_attempts_message_id_outbox"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_attempts")),
        sa.UniqueConstraint("message_id", "attempt", name="uq_delivery_attempts_message_attempt"),
    )


def downgrade() -> None:
    op.drop_table("delivery_attempts")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_due")

    op.drop_table("outbox")
    op.drop_table("attempts")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_job_status")

    op.drop_table("runs")
