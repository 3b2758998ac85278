"""cached tokens: the prompt tokens a provider read from its prompt cache and wrote to it

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 23:50:00

``model_calls.cached_tokens`` and ``model_calls.cache_write_tokens``: of a call's prompt
tokens, those the provider read from its prompt cache (OpenAI's
``prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``) and those it
wrote to it (Anthropic's ``cache_creation_input_tokens``), recorded with the call's usage and
priced apart. NULL on the calls made before and on those whose provider reported none.
Nullable columns only: existing rows are untouched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("model_calls", sa.Column("cached_tokens", sa.Integer(), nullable=True))
    op.add_column("model_calls", sa.Column("cache_write_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_calls", schema=None) as batch_op:
        batch_op.drop_column("cache_write_tokens")
        batch_op.drop_column("cached_tokens")
