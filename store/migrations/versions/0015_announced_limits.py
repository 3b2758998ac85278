"""announced limits: what a provider's rate-limit headers announced, in the endpoint's row

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 23:50:00

``endpoint_limits.announced_requests_per_minute`` and ``announced_tokens_per_minute``: the
limits the endpoint's answers announced (OpenAI's ``x-ratelimit-*``, Anthropic's
``anthropic-ratelimit-*`` headers), per minute, which an endpoint with no configured limit
adopts and a lower configured one overrides; ``answered_at``: the endpoint's last answer;
``probe_at``: when the one call an endpoint knowing no rate sends first left. Nullable columns
only: every existing row reads as it did (an endpoint that has learned nothing probes once).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

COLUMNS = ("announced_requests_per_minute", "announced_tokens_per_minute", "answered_at",
           "probe_at")


def upgrade() -> None:
    with op.batch_alter_table("endpoint_limits", schema=None) as batch_op:
        batch_op.add_column(sa.Column("announced_requests_per_minute", sa.Float(),
                                      nullable=True))
        batch_op.add_column(sa.Column("announced_tokens_per_minute", sa.BigInteger(),
                                      nullable=True))
        batch_op.add_column(sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("probe_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("endpoint_limits", schema=None) as batch_op:
        for column in reversed(COLUMNS):
            batch_op.drop_column(column)
