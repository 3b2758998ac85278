"""batches: model calls queued for a provider's Batch API, and the Runs waiting for them

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 06:30:00

Batch mode (issue 48). ``runs.status`` gains ``waiting`` (its calls queued in a batch: never
claimed until the batch releases it); ``model_calls.outcome`` gains ``queued`` (a call waiting
in a batch: neither in flight nor paid) and ``withdrawn`` (a call its batch ended without, taken
out to be called synchronously: never paid) and ``model_calls`` gains ``batch_key`` (the batch that
holds it), ``custom_id`` (its line's id), ``request`` (the body its line sends) and ``flow_run_id`` (the
tick that queued it), ``queued_tokens`` (its prompt's bound, held in the provider's queue), a partial
unique index (a Run queues a call once) and a partial index of the queued calls no batch holds.
New table ``batches``: one per batch of a job and endpoint, its provider ids and status, its
lease, what became of its calls. Nullable columns only: every existing row reads as it did.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from store.check_edits import replace_check, values_in

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
OLD_RUN = ("pending", "running", "completed", "failed")
NEW_RUN = ("pending", "running", "waiting", "completed", "failed")
OLD_CALL = ("answered", "refused", "failed", "lost")
NEW_CALL = (*OLD_CALL, "queued", "withdrawn")
QUEUED = "outcome = 'queued'"
UNBATCHED = "outcome = 'queued' AND batch_key IS NULL"


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("batch_key", sa.String(length=64), nullable=False),
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=300), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("flow_run_id", sa.String(length=36), nullable=True),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("input_digest", sa.String(length=64), nullable=False),
        sa.Column("requests", sa.Integer(), server_default="0", nullable=False),
        sa.Column("provider_file_id", sa.String(length=300), nullable=True),
        sa.Column("provider_batch_id", sa.String(length=300), nullable=True),
        sa.Column("provider_status", sa.Text(), nullable=True),
        sa.Column("provider_total", sa.Integer(), nullable=True),
        sa.Column("provider_completed", sa.Integer(), nullable=True),
        sa.Column("provider_failed", sa.Integer(), nullable=True),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=300), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("polled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("answered", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refused", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failed", sa.Integer(), server_default="0", nullable=False),
        sa.Column("requeued", sa.Integer(), server_default="0", nullable=False),
        sa.Column("withdrawn", sa.Integer(), server_default="0", nullable=False),
        sa.Column("cost_nanos", sa.BigInteger(), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint("kind IN ('openai', 'anthropic')", name=op.f("ck_batches_kind")),
        sa.CheckConstraint("status IN ('open', 'submitted', 'settled')",
                           name=op.f("ck_batches_status")),
        sa.CheckConstraint("fence >= 0", name=op.f("ck_batches_fence_non_negative")),
        sa.CheckConstraint("requests >= 0", name=op.f("ck_batches_requests_non_negative")),
        sa.PrimaryKeyConstraint("batch_key", name=op.f("pk_batches")),
    )
    op.create_index("ix_batches_status", "batches", ["status", "created_at"])
    op.create_index("ix_batches_provider_batch_id", "batches", ["provider_batch_id"])
    replace_check("runs", "status", "ck_runs_status", OLD_RUN, NEW_RUN)
    with op.batch_alter_table("model_calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("custom_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("request", JSON, nullable=True))
        batch_op.add_column(sa.Column("sync_cost_nanos", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("flow_run_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("queued_tokens", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(op.f("fk_model_calls_batch_key_batches"), "batches",
                                    ["batch_key"], ["batch_key"])
        batch_op.drop_constraint(op.f("ck_model_calls_outcome"), type_="check")
        batch_op.create_check_constraint(
            op.f("ck_model_calls_outcome"), "outcome IS NULL OR " + values_in("outcome", NEW_CALL))
    op.create_index("uq_model_calls_queued", "model_calls",
                    ["run_id", "position", "prompt_digest"], unique=True,
                    postgresql_where=sa.text(QUEUED), sqlite_where=sa.text(QUEUED))
    op.create_index("ix_model_calls_unbatched", "model_calls", ["endpoint", "job", "started_at"],
                    postgresql_where=sa.text(UNBATCHED), sqlite_where=sa.text(UNBATCHED))


def downgrade() -> None:
    # The older schema has no batches: a queued call never left (nothing was paid) and its
    # waiting Run goes back to pending, to be run again without batch mode.
    op.drop_index("ix_model_calls_unbatched", table_name="model_calls")
    op.drop_index("uq_model_calls_queued", table_name="model_calls")
    op.execute("DELETE FROM model_calls WHERE outcome IN ('queued', 'withdrawn')")
    op.execute("UPDATE runs SET status = 'pending' WHERE status = 'waiting'")
    with op.batch_alter_table("model_calls", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_model_calls_outcome"), type_="check")
        batch_op.create_check_constraint(
            op.f("ck_model_calls_outcome"), "outcome IS NULL OR " + values_in("outcome", OLD_CALL))
        batch_op.drop_constraint(op.f("fk_model_calls_batch_key_batches"), type_="foreignkey")
        for column in ("queued_tokens", "flow_run_id", "sync_cost_nanos", "request", "custom_id", "batch_key"):
            batch_op.drop_column(column)
    replace_check("runs", "status", "ck_runs_status", NEW_RUN, OLD_RUN)
    op.drop_index("ix_batches_provider_batch_id", table_name="batches")
    op.drop_index("ix_batches_status", table_name="batches")
    op.drop_table("batches")
