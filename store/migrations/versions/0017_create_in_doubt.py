"""batches: at most one create in doubt per provider kind without batch metadata

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 23:00:00

Anthropic's Message Batches carry no metadata, so a batch whose create lost its reply (or whose
submitter was killed before storing the id) is found again only as the one batch of that
provider the ledger does not name. A partial unique index keeps at most one such create in
doubt per kind: a batch whose file id is ``inline`` (its requests go with the create) and whose
provider id is not stored yet, while it is open. No existing row is in that state (0016 wrote
no ``inline`` file ids).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

IN_DOUBT = "provider_file_id = 'inline' AND provider_batch_id IS NULL AND status = 'open'"


def upgrade() -> None:
    op.create_index("uq_batches_create_in_doubt", "batches", ["kind"], unique=True,
                    postgresql_where=sa.text(IN_DOUBT), sqlite_where=sa.text(IN_DOUBT))


def downgrade() -> None:
    op.drop_index("uq_batches_create_in_doubt", table_name="batches")
