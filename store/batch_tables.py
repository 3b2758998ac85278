"""The ledger's table of provider batches: the model calls of one job and endpoint sent through
a provider's Batch API together, as a SQLModel class; Alembic migrations create it (see
migrations/). The calls a batch holds are ``model_calls`` rows whose ``batch_key`` names it."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from store.columns import check_in, count, ts
from store.identity import MAX_CHARS
from store.models import MAX_OWNER

BATCH_KINDS = ("openai", "anthropic")
# open: its intent committed, its file or provider batch perhaps not yet; submitted: the
# provider has it; settled: its results recorded, its calls without one queued again.
BATCH_STATUSES = ("open", "submitted", "settled")
LEASED_STATUSES = ("open", "submitted")  # a batch a submitter or poller may lease
# The file id of a batch whose provider takes its requests with the create (no file, and no
# metadata to find the batch by its key).
INLINE_FILE = "inline"
# Such a batch's create is in doubt from its file id's commit until its provider id is stored:
# at most one at a time per kind, so that a create whose reply was lost is the one batch of
# that provider no ledger row names.
IN_DOUBT_WHERE = (f"provider_file_id = '{INLINE_FILE}' AND provider_batch_id IS NULL "
                  "AND status = 'open'")


class Batch(SQLModel, table=True):
    """One batch of queued model calls of a job and endpoint at a provider: its key (the
    provider's metadata names it, so that a submitter that crashed finds it again), what it
    holds (``requests``, ``input_digest`` of its lines), the provider's file and batch ids and
    status as last seen, the lease of whoever submits or polls it (fenced, database clock) and,
    once settled, what became of its calls and what they cost."""

    __tablename__ = "batches"
    __table_args__ = (
        check_in("kind", BATCH_KINDS, "kind"),
        check_in("status", BATCH_STATUSES, "status"),
        sa.CheckConstraint("fence >= 0", name="fence_non_negative"),
        sa.CheckConstraint("requests >= 0", name="requests_non_negative"),
        sa.Index("ix_batches_status", "status", "created_at"),
        sa.Index("ix_batches_provider_batch_id", "provider_batch_id"),
        sa.Index("uq_batches_create_in_doubt", "kind", unique=True,
                 postgresql_where=sa.text(IN_DOUBT_WHERE), sqlite_where=sa.text(IN_DOUBT_WHERE)),
    )

    batch_key: str = Field(primary_key=True, max_length=64)
    job: str = Field(max_length=MAX_CHARS["job"])
    endpoint: str = Field(max_length=300)
    model: str = Field(max_length=300)
    kind: str = Field(max_length=16)
    status: str = Field(default="open", max_length=16)
    flow_run_id: str | None = Field(default=None, max_length=36)  # the tick that opened it
    period_start: datetime | None = ts()
    input_digest: str = Field(max_length=64)
    requests: int = count()
    provider_file_id: str | None = Field(default=None, max_length=300)
    provider_batch_id: str | None = Field(default=None, max_length=300)
    provider_status: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    # The provider's counts of the batch's requests, as it last reported them (NULL: never).
    provider_total: int | None = None
    provider_completed: int | None = None
    provider_failed: int | None = None
    fence: int = 0
    owner: str | None = Field(default=None, max_length=MAX_OWNER)
    lease_expires_at: datetime | None = ts()
    # When its calls stop waiting for batches: past it, a batch still running is cancelled and
    # the calls it ends without are called synchronously (NULL: no deadline).
    deadline_at: datetime | None = ts()
    created_at: datetime | None = ts(nullable=False)
    submitted_at: datetime | None = ts()
    polled_at: datetime | None = ts()
    settled_at: datetime | None = ts()
    # Once settled: its calls answered, refused, failed, queued again (no result line) and
    # withdrawn (no result line, its deadline near: called synchronously instead).
    answered: int = count()
    refused: int = count()
    failed: int = count()
    requeued: int = count()
    withdrawn: int = count()
    cost_nanos: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    currency: str | None = Field(default=None, max_length=3)
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))


batches_table: sa.Table = Batch.__table__  # type: ignore[attr-defined]
