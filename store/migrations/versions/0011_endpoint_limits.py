"""endpoint limits: the requests and tokens per minute and the calls in flight a named model
endpoint allows, shared by every worker, and the pause a provider's 429 asks of all of them

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 16:30:00

``endpoint_limits``: one row per endpoint name, written by the first tick that uses it: the
configured limits (NULL: none), the adaptive request rate, the token buckets' levels as of
``refilled_at`` and ``paused_until``, all on the database clock. A partial index on the model
calls in flight (outcome NULL) per endpoint lets the limiter count them. New table and index
only: existing rows are untouched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "endpoint_limits",
        sa.Column("name", sa.String(length=300), nullable=False),
        sa.Column("requests_per_minute", sa.Float(), nullable=True),
        sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("rate", sa.Float(), nullable=True),
        sa.Column("request_level", sa.Float(), nullable=False),
        sa.Column("token_level", sa.Float(), nullable=False),
        sa.Column("refilled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("refusals", sa.Integer(), server_default="0", nullable=False),
        sa.Column("granted", sa.Boolean(), nullable=False),
        sa.Column("calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refused", sa.Integer(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("requests_per_minute IS NULL OR requests_per_minute > 0",
                           name=op.f("ck_endpoint_limits_requests_per_minute_positive")),
        sa.CheckConstraint("tokens_per_minute IS NULL OR tokens_per_minute > 0",
                           name=op.f("ck_endpoint_limits_tokens_per_minute_positive")),
        sa.CheckConstraint("max_concurrent IS NULL OR max_concurrent > 0",
                           name=op.f("ck_endpoint_limits_max_concurrent_positive")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_endpoint_limits")),
    )
    op.create_index("ix_model_calls_in_flight", "model_calls", ["endpoint", "started_at"],
                    postgresql_where=sa.text("outcome IS NULL"),
                    sqlite_where=sa.text("outcome IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_model_calls_in_flight", table_name="model_calls")
    op.drop_table("endpoint_limits")
