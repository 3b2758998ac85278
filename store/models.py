"""The ledger's tables of Runs, their attempts, the outbox and what jobs owe, as SQLModel classes
(the model-call tables are ``store.call_tables``); Alembic migrations create them (see
migrations/)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from store.columns import UTCDateTime, check_in, count, json_doc, ts
from store.identity import MAX_CHARS

RUNS_FILLFACTOR = 60  # percent of a runs page filled by inserts; the rest takes updated versions
MAX_OWNER = 300  # characters of a lease owner such as host:pid
# waiting: its model calls are queued in a provider's batch (never claimed until released).
RUN_STATUSES = ("pending", "running", "waiting", "completed", "failed")
UNFINISHED_STATUSES = ("pending", "running", "waiting")  # neither completed nor failed
ATTEMPT_OUTCOMES = ("completed", "released", "failed", "expired")
# held: waiting for a person's approval (never claimed); rejected: a person said no (never sent).
MESSAGE_STATUSES = ("pending", "sending", "sent", "retry", "uncertain", "dead", "held", "rejected")
DECISIONS = ("approved", "rejected")
DELIVERY_OUTCOMES = ("sent", "retry", "uncertain", "dead")
CLAIMABLE_STATUSES = ("pending", "retry", "uncertain", "sending")  # what a dispatcher may claim
CLAIMABLE_WHERE = "status IN (" + ", ".join(f"'{s}'" for s in CLAIMABLE_STATUSES) + ")"


class Run(SQLModel, table=True):
    """One logical run: (job, subject, period_start, version); one row, forever."""

    __tablename__ = "runs"
    __table_args__ = (
        # One row per identity and revision: a revision N is inserted once, whoever asks.
        sa.UniqueConstraint("job", "subject", "period_start", "version", "revision",
                            name="uq_runs_identity"),
        check_in("status", RUN_STATUSES, "status"),
        sa.CheckConstraint("fence >= 0", name="fence_non_negative"),
        sa.CheckConstraint("revision >= 0", name="revision_non_negative"),
        # No index holds a column that transitions change (status, fence, lease, output), and
        # pages keep free room: every Run update is a HOT update that touches no index. (The
        # revision columns are set on insert and never change.)
        {"postgresql_with": {"fillfactor": RUNS_FILLFACTOR}},
    )

    run_id: str = Field(primary_key=True, max_length=64)
    job: str = Field(max_length=MAX_CHARS["job"])
    subject: str = Field(max_length=MAX_CHARS["subject"])
    period_start: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    version: str = Field(max_length=MAX_CHARS["version"])
    params_fingerprint: str = Field(max_length=64)
    params: dict[str, Any] | None = json_doc()
    status: str = Field(default="pending", max_length=16)
    fence: int = 0
    owner: str | None = Field(default=None, max_length=MAX_OWNER)
    lease_expires_at: datetime | None = ts()
    attempts: int = 0
    raw_input: dict[str, Any] | None = json_doc()
    output: dict[str, Any] | None = json_doc()
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    completed_attempt_id: str | None = Field(default=None, max_length=36)
    # Where the output came from: the Prefect flow run and (persist) task run that completed it.
    completed_flow_run_id: str | None = Field(default=None, max_length=36)
    completed_task_run_id: str | None = Field(default=None, max_length=36)
    model_calls: int = count()
    created_at: datetime | None = ts(nullable=False)
    updated_at: datetime | None = ts(nullable=False)
    completed_at: datetime | None = ts()
    # An explicit revision (0: the original): the Run it follows, why, whether its messages
    # are queued again, and who asked (a revise flow run's id, so that a retry of that flow
    # run resumes its revision instead of asking for another).
    revision: int = count()
    revises_run_id: str | None = Field(default=None, max_length=64)
    revision_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    resend: bool | None = None
    requested_by: str | None = Field(default=None, max_length=MAX_OWNER)
    # A tombstone (``runledger prune``): when its documents and children were deleted, and the
    # sha256 of the canonical JSON of the output it no longer holds.
    pruned_at: datetime | None = ts()
    output_digest: str | None = Field(default=None, max_length=64)


class Attempt(SQLModel, table=True):
    """One execution trying to finish a Run; one row per successful claim (per fence)."""

    __tablename__ = "attempts"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "fence", name="uq_attempts_run_fence"),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ("
            + ", ".join(f"'{v}'" for v in ATTEMPT_OUTCOMES) + ")",
            name="outcome",
        ),
    )

    attempt_id: str = Field(primary_key=True, max_length=36)
    run_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("runs.run_id"), nullable=False)
    )
    owner: str = Field(max_length=MAX_OWNER)
    fence: int
    started_at: datetime | None = ts(nullable=False)
    finished_at: datetime | None = ts()
    outcome: str | None = Field(default=None, max_length=16)
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    model_calls: int | None = None  # set when the Attempt ends by a worker's own hand


class QueuedMessage(SQLModel, table=True):
    """An outbox message: a durable intent to deliver, keyed by a stable idempotency key."""

    __tablename__ = "outbox"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "channel", "recipient", name="uq_outbox_run_channel_recipient"),
        check_in("status", MESSAGE_STATUSES, "status"),
        # Only messages still to deliver, in claim order: a claim reads ``limit`` entries of
        # this index instead of sorting the whole due backlog, and sent messages (nearly all
        # rows, in time) never enter it.
        sa.Index(
            "ix_outbox_claimable", "next_attempt_at", "message_id",
            postgresql_where=sa.text(CLAIMABLE_WHERE), sqlite_where=sa.text(CLAIMABLE_WHERE),
        ),
    )

    message_id: str = Field(primary_key=True, max_length=64)
    run_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("runs.run_id"), nullable=False)
    )
    channel: str = Field(max_length=32)
    # The channel's target: an email address, a webhook endpoint block's name, or a bucket
    # block's name and an object key.
    recipient: str = Field(max_length=1100)
    subject: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    body: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    headers: dict[str, Any] | None = json_doc()
    payload: dict[str, Any] | None = json_doc()  # a webhook's JSON, an object's body; NULL for email
    status: str = Field(default="pending", max_length=16)
    attempts: int = 0
    fence: int = 0
    lease_owner: str | None = Field(default=None, max_length=MAX_OWNER)
    lease_expires_at: datetime | None = ts()
    claimed_at: datetime | None = ts()
    next_attempt_at: datetime | None = ts()
    last_error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    provider_message_id: str | None = Field(default=None, max_length=300)
    created_at: datetime | None = ts(nullable=False)
    updated_at: datetime | None = ts(nullable=False)
    sent_at: datetime | None = ts()
    # A held message: when its hold is overdue, and the person's decision on it (who, when, why).
    hold_until: datetime | None = ts()
    decision: str | None = Field(default=None, max_length=16)
    decided_by: str | None = Field(default=None, max_length=MAX_OWNER)
    decided_at: datetime | None = ts()
    decision_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))


class DeliveryAttempt(SQLModel, table=True):
    """One try to send an outbox message; the message's key never changes between them."""

    __tablename__ = "delivery_attempts"
    __table_args__ = (
        sa.UniqueConstraint("message_id", "attempt", name="uq_delivery_attempts_message_attempt"),
        check_in("outcome", DELIVERY_OUTCOMES, "outcome"),
    )

    id: int | None = Field(default=None, primary_key=True)
    message_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("outbox.message_id"), nullable=False)
    )
    attempt: int
    owner: str = Field(max_length=MAX_OWNER)
    started_at: datetime | None = ts(nullable=False)
    finished_at: datetime | None = ts(nullable=False)
    outcome: str = Field(max_length=16)
    reply_code: int | None = None
    reply_text: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    provider_message_id: str | None = Field(default=None, max_length=300)


class Obligation(SQLModel, table=True):
    """What a job owes for one subject: every period from ``owed_from`` on (recorded the first
    time the job runs or is reconciled with the subject; a subject added later is owed from
    then, never before)."""

    __tablename__ = "obligations"

    job: str = Field(primary_key=True, max_length=MAX_CHARS["job"])
    subject: str = Field(primary_key=True, max_length=MAX_CHARS["subject"])
    owed_from: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    created_at: datetime | None = ts(nullable=False)


class Occurrence(SQLModel, table=True):
    """The decisions and alerts about one owed (subject, period) of a job version, keyed like
    its Run (which may not exist): skipped by the missed-run policy, reported overdue, recovered,
    its Run given up; each decision's event is known emitted once its ``*_emitted_at`` is set."""

    __tablename__ = "occurrences"
    __table_args__ = (sa.Index("ix_occurrences_job_period", "job", "period_start"),)

    run_id: str = Field(primary_key=True, max_length=64)
    job: str = Field(max_length=MAX_CHARS["job"])
    subject: str = Field(max_length=MAX_CHARS["subject"])
    period_start: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    version: str = Field(max_length=MAX_CHARS["version"])
    skipped_at: datetime | None = ts()
    skip_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    overdue_at: datetime | None = ts()
    recovered_at: datetime | None = ts()
    created_at: datetime | None = ts(nullable=False)
    updated_at: datetime | None = ts(nullable=False)
    gave_up_at: datetime | None = ts()
    skip_emitted_at: datetime | None = ts()
    overdue_emitted_at: datetime | None = ts()
    recovered_emitted_at: datetime | None = ts()
    gave_up_emitted_at: datetime | None = ts()
    # The lease of the pass emitting the row's events (database clock): one pass at a time.
    emitting_until: datetime | None = ts()


class SuppressedCount(SQLModel, table=True):
    """How often a job's ticks of one UTC day asked again for a Run already completed
    (``duplicates``) or leased by another worker (``in_progress_elsewhere``): counted once per
    tick, never per subject."""

    __tablename__ = "suppressed_counts"

    job: str = Field(primary_key=True, max_length=MAX_CHARS["job"])
    day: date = Field(sa_column=sa.Column(sa.Date, primary_key=True))
    duplicates: int = count()
    in_progress_elsewhere: int = count()
    updated_at: datetime | None = ts(nullable=False)


runs_table: sa.Table = Run.__table__  # type: ignore[attr-defined]
attempts_table: sa.Table = Attempt.__table__  # type: ignore[attr-defined]
outbox_table: sa.Table = QueuedMessage.__table__  # type: ignore[attr-defined]
delivery_attempts_table: sa.Table = DeliveryAttempt.__table__  # type: ignore[attr-defined]
obligations_table: sa.Table = Obligation.__table__  # type: ignore[attr-defined]
occurrences_table: sa.Table = Occurrence.__table__  # type: ignore[attr-defined]
suppressed_counts_table: sa.Table = SuppressedCount.__table__  # type: ignore[attr-defined]

# Table models are built with model_construct when read back (no re-validation); SQLAlchemy
# must have configured their mappers before such an instance's attributes are used.
sa.orm.configure_mappers()
