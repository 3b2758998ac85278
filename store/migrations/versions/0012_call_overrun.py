"""model call overrun: the tokens a provider billed beyond a call's bound

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 09:30:00

``model_calls.overrun``: the tokens an answer was billed beyond the bound its call reserved
(its input tokens bounded, plus the max_tokens it sent), recorded with its usage, so that
`runledger costs` reports a provider that did not honour max_tokens. NULL on the calls made
before, and while a call is in flight. A nullable column only: existing rows are untouched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("model_calls", sa.Column("overrun", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_calls", schema=None) as batch_op:
        batch_op.drop_column("overrun")
