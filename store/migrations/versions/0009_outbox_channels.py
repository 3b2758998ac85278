"""outbox channels: a JSON payload per message, and targets as long as an object key

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 12:10:00

The outbox delivers more than email (issue 37): a webhook message's target is its endpoint
block's name and its payload a JSON object; an object write's target is its bucket block's name
and the object key (up to 1024 bytes), its payload the report's body and content type. The
``recipient`` column holds every channel's target (an address for email) and stays the third
part of the unique (run, channel, recipient); ``payload`` is NULL for email, whose subject,
body and headers keep their columns, so every existing row reads as it did.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TARGET_CHARS = 1100


def upgrade() -> None:
    op.add_column("outbox", sa.Column("payload", JSON_DOC, nullable=True))
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.alter_column("recipient", type_=sa.String(length=TARGET_CHARS),
                              existing_type=sa.String(length=320), existing_nullable=False)


def downgrade() -> None:
    # The older schema knows only email: the other channels' messages cannot be kept.
    op.execute("DELETE FROM delivery_attempts WHERE message_id IN "
               "(SELECT message_id FROM outbox WHERE channel <> 'email')")
    op.execute("DELETE FROM outbox WHERE channel <> 'email'")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.alter_column("recipient", type_=sa.String(length=320),
                              existing_type=sa.String(length=TARGET_CHARS), existing_nullable=False)
        batch_op.drop_column("payload")
