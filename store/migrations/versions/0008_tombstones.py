"""tombstones: what retention keeps of a pruned Run

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 03:10:00

Retention (issue 23): `runledger prune` nulls a completed Run's bulky columns (raw input,
output, error, params) and deletes its Attempts, its final outbox rows and their delivery
attempts, but keeps the Run row itself as its tombstone: identity, status, fence, params
fingerprint, counts and completion, so that a rerun of its period is still a duplicate. The
tombstone records when it was pruned (``pruned_at``) and the sha256 of the output it no longer
holds (``output_digest``). Nullable columns only: every existing Run reads as not pruned.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("output_digest", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("output_digest")
        batch_op.drop_column("pruned_at")
