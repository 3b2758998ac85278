"""model calls and budgets: every model call recorded before it leaves, its answer checkpointed,
and what a job may spend per window

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 12:00:00

``model_calls``: one row per request to a model endpoint, inserted (fenced by the Attempt's
lease) before the request leaves the process; its outcome (answered, refused, failed, lost) is
NULL while it is in flight. An answered call holds the answer (the checkpoint of its position
in the transform, found again by the prompt's digest), the tokens the provider reported, the
latency and the cost in billionths of its currency. ``budget_windows``: per job and window (a
period of the job, or a UTC day) the cap, what calls in flight reserved and what answered calls
spent. ``suppressed_costs``: per job, UTC day and currency, what the duplicates its ticks
suppressed would have cost (each duplicate Run's stored cost). New tables only: existing Runs
have no recorded calls.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "model_calls",
        sa.Column("call_id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("attempt_id", sa.String(length=36), nullable=False),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=300), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("prompt_digest", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column("cost_nanos", sa.BigInteger(), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=True),
        sa.Column("answer", JSON, nullable=True),
        sa.Column("rejected_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reuses", sa.Integer(), server_default="0", nullable=False),
        sa.Column("estimate", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("budget_period", sa.DateTime(timezone=True), nullable=True),
        sa.Column("budget_day", sa.Date(), nullable=True),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('answered', 'refused', 'failed', 'lost')",
            name=op.f("ck_model_calls_outcome")),
        sa.CheckConstraint("position >= 0", name=op.f("ck_model_calls_position_non_negative")),
        sa.CheckConstraint("estimate >= 0", name=op.f("ck_model_calls_estimate_non_negative")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_model_calls_run_id_runs")),
        sa.PrimaryKeyConstraint("call_id", name=op.f("pk_model_calls")),
    )
    op.create_index("ix_model_calls_run_position", "model_calls", ["run_id", "position"])
    op.create_index("ix_model_calls_started_at", "model_calls", ["started_at"])
    op.create_table(
        "budget_windows",
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("unit", sa.String(length=8), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=True),
        sa.Column("cap", sa.BigInteger(), nullable=False),
        sa.Column("reserved", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("spent", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refused", sa.Integer(), server_default="0", nullable=False),
        sa.Column("exhausted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("scope IN ('period', 'day')", name=op.f("ck_budget_windows_scope")),
        sa.CheckConstraint("unit IN ('money', 'tokens')", name=op.f("ck_budget_windows_unit")),
        sa.CheckConstraint("cap >= 0", name=op.f("ck_budget_windows_cap_non_negative")),
        sa.CheckConstraint("reserved >= 0", name=op.f("ck_budget_windows_reserved_non_negative")),
        sa.PrimaryKeyConstraint("job", "scope", "window_start", name=op.f("pk_budget_windows")),
    )
    op.create_table(
        "suppressed_costs",
        sa.Column("job", sa.String(length=200), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("runs", sa.Integer(), server_default="0", nullable=False),
        sa.Column("calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("cost_nanos", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job", "day", "currency", name=op.f("pk_suppressed_costs")),
    )


def downgrade() -> None:
    op.drop_table("suppressed_costs")
    op.drop_table("budget_windows")
    op.drop_index("ix_model_calls_started_at", table_name="model_calls")
    op.drop_index("ix_model_calls_run_position", table_name="model_calls")
    op.drop_table("model_calls")
