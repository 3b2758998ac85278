"""The ledger's tables as SQLModel classes; Alembic migrations create them (see migrations/)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlmodel import Field, SQLModel

from store.errors import InvalidInput
from store.identity import MAX_CHARS, require_aware

SQLModel.metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

RUNS_FILLFACTOR = 60  # percent of a runs page filled by inserts; the rest takes updated versions
MAX_OWNER = 300  # characters of a lease owner such as host:pid
RUN_STATUSES = ("pending", "running", "completed", "failed")
ATTEMPT_OUTCOMES = ("completed", "released", "failed", "expired")
# held: waiting for a person's approval (never claimed); rejected: a person said no (never sent).
MESSAGE_STATUSES = ("pending", "sending", "sent", "retry", "uncertain", "dead", "held", "rejected")
DECISIONS = ("approved", "rejected")
DELIVERY_OUTCOMES = ("sent", "retry", "uncertain", "dead")
CLAIMABLE_STATUSES = ("pending", "retry", "uncertain", "sending")  # what a dispatcher may claim
CLAIMABLE_WHERE = "status IN (" + ", ".join(f"'{s}'" for s in CLAIMABLE_STATUSES) + ")"


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Timestamps are stored in UTC and always come back timezone-aware (SQLite forgets zones)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        utc = require_aware(value, "timestamp", InvalidInput)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Real(sa.types.TypeDecorator[float]):
    """A double-precision float read back as a Python float (psycopg's numeric result
    processor wants a column type code that a prepared statement's processors do not have)."""

    impl = sa.Float()
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        return lambda value: None if value is None else float(value)


JSONDoc = sa.JSON().with_variant(JSONB(), "postgresql")


def _ts(nullable: bool = True, **kw: Any) -> Any:
    return Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=nullable, **kw))


def _json() -> Any:
    return Field(default=None, sa_column=sa.Column(JSONDoc, nullable=True))


def _count() -> Any:
    """A counter column: 0 for rows that existed before it (the server default)."""
    return Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0"))


def _check_in(column: str, values: tuple[str, ...], name: str) -> sa.CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({listed})", name=name)


class Run(SQLModel, table=True):
    """One logical run: (job, subject, period_start, version); one row, forever."""

    __tablename__ = "runs"
    __table_args__ = (
        # One row per identity and revision: a revision N is inserted once, whoever asks.
        sa.UniqueConstraint("job", "subject", "period_start", "version", "revision",
                            name="uq_runs_identity"),
        _check_in("status", RUN_STATUSES, "status"),
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
    params: dict[str, Any] | None = _json()
    status: str = Field(default="pending", max_length=16)
    fence: int = 0
    owner: str | None = Field(default=None, max_length=MAX_OWNER)
    lease_expires_at: datetime | None = _ts()
    attempts: int = 0
    raw_input: dict[str, Any] | None = _json()
    output: dict[str, Any] | None = _json()
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    completed_attempt_id: str | None = Field(default=None, max_length=36)
    # Where the output came from: the Prefect flow run and (persist) task run that completed it.
    completed_flow_run_id: str | None = Field(default=None, max_length=36)
    completed_task_run_id: str | None = Field(default=None, max_length=36)
    model_calls: int = _count()
    created_at: datetime | None = _ts(nullable=False)
    updated_at: datetime | None = _ts(nullable=False)
    completed_at: datetime | None = _ts()
    # An explicit revision (0: the original): the Run it follows, why, whether its messages
    # are queued again, and who asked (a revise flow run's id, so that a retry of that flow
    # run resumes its revision instead of asking for another).
    revision: int = _count()
    revises_run_id: str | None = Field(default=None, max_length=64)
    revision_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    resend: bool | None = None
    requested_by: str | None = Field(default=None, max_length=MAX_OWNER)
    # A tombstone (``runledger prune``): when its documents and children were deleted, and the
    # sha256 of the canonical JSON of the output it no longer holds.
    pruned_at: datetime | None = _ts()
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
    started_at: datetime | None = _ts(nullable=False)
    finished_at: datetime | None = _ts()
    outcome: str | None = Field(default=None, max_length=16)
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    model_calls: int | None = None  # set when the Attempt ends by a worker's own hand


class QueuedMessage(SQLModel, table=True):
    """An outbox message: a durable intent to deliver, keyed by a stable idempotency key."""

    __tablename__ = "outbox"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "channel", "recipient", name="uq_outbox_run_channel_recipient"),
        _check_in("status", MESSAGE_STATUSES, "status"),
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
    headers: dict[str, Any] | None = _json()
    payload: dict[str, Any] | None = _json()  # a webhook's JSON, an object's body; NULL for email
    status: str = Field(default="pending", max_length=16)
    attempts: int = 0
    fence: int = 0
    lease_owner: str | None = Field(default=None, max_length=MAX_OWNER)
    lease_expires_at: datetime | None = _ts()
    claimed_at: datetime | None = _ts()
    next_attempt_at: datetime | None = _ts()
    last_error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    provider_message_id: str | None = Field(default=None, max_length=300)
    created_at: datetime | None = _ts(nullable=False)
    updated_at: datetime | None = _ts(nullable=False)
    sent_at: datetime | None = _ts()
    # A held message: when its hold is overdue, and the person's decision on it (who, when, why).
    hold_until: datetime | None = _ts()
    decision: str | None = Field(default=None, max_length=16)
    decided_by: str | None = Field(default=None, max_length=MAX_OWNER)
    decided_at: datetime | None = _ts()
    decision_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))


class DeliveryAttempt(SQLModel, table=True):
    """One try to send an outbox message; the message's key never changes between them."""

    __tablename__ = "delivery_attempts"
    __table_args__ = (
        sa.UniqueConstraint("message_id", "attempt", name="uq_delivery_attempts_message_attempt"),
        _check_in("outcome", DELIVERY_OUTCOMES, "outcome"),
    )

    id: int | None = Field(default=None, primary_key=True)
    message_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("outbox.message_id"), nullable=False)
    )
    attempt: int
    owner: str = Field(max_length=MAX_OWNER)
    started_at: datetime | None = _ts(nullable=False)
    finished_at: datetime | None = _ts(nullable=False)
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
    created_at: datetime | None = _ts(nullable=False)


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
    skipped_at: datetime | None = _ts()
    skip_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    overdue_at: datetime | None = _ts()
    recovered_at: datetime | None = _ts()
    created_at: datetime | None = _ts(nullable=False)
    updated_at: datetime | None = _ts(nullable=False)
    gave_up_at: datetime | None = _ts()
    skip_emitted_at: datetime | None = _ts()
    overdue_emitted_at: datetime | None = _ts()
    recovered_emitted_at: datetime | None = _ts()
    gave_up_emitted_at: datetime | None = _ts()
    # The lease of the pass emitting the row's events (database clock): one pass at a time.
    emitting_until: datetime | None = _ts()


class SuppressedCount(SQLModel, table=True):
    """How often a job's ticks of one UTC day asked again for a Run already completed
    (``duplicates``) or leased by another worker (``in_progress_elsewhere``): counted once per
    tick, never per subject."""

    __tablename__ = "suppressed_counts"

    job: str = Field(primary_key=True, max_length=MAX_CHARS["job"])
    day: date = Field(sa_column=sa.Column(sa.Date, primary_key=True))
    duplicates: int = _count()
    in_progress_elsewhere: int = _count()
    updated_at: datetime | None = _ts(nullable=False)


CALL_OUTCOMES = ("answered", "refused", "failed", "lost")
BUDGET_UNITS = ("money", "tokens")
BUDGET_SCOPES = ("period", "day")


class ModelCall(SQLModel, table=True):
    """One request to a model endpoint on behalf of an Attempt: recorded (fenced) before it
    leaves the process; its outcome is NULL while it is in flight. An answered call holds the
    Run's checkpoint of that position in the transform (``answer``), reused by a later attempt
    whose prompt has the same digest, unless validation rejected it (``rejected_at``)."""

    __tablename__ = "model_calls"
    __table_args__ = (
        sa.Index("ix_model_calls_run_position", "run_id", "position"),
        sa.Index("ix_model_calls_started_at", "started_at"),
        # The endpoint limiter counts the calls in flight of an endpoint.
        sa.Index("ix_model_calls_in_flight", "endpoint", "started_at",
                 postgresql_where=sa.text("outcome IS NULL"),
                 sqlite_where=sa.text("outcome IS NULL")),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN (" + ", ".join(f"'{v}'" for v in CALL_OUTCOMES) + ")",
            name="outcome"),
        sa.CheckConstraint("position >= 0", name="position_non_negative"),
        sa.CheckConstraint("estimate >= 0", name="estimate_non_negative"),
    )

    call_id: str = Field(primary_key=True, max_length=36)
    run_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("runs.run_id"), nullable=False)
    )
    # The Attempt's id and fence: no foreign key, a call's cost outlives its pruned Attempt.
    attempt_id: str = Field(max_length=36)
    fence: int
    job: str = Field(max_length=MAX_CHARS["job"])
    endpoint: str = Field(max_length=300)
    model: str = Field(max_length=300)
    position: int
    prompt_digest: str = Field(max_length=64)
    started_at: datetime | None = _ts(nullable=False)
    finished_at: datetime | None = _ts()
    outcome: str | None = Field(default=None, max_length=16)
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Of the prompt's tokens, those the provider read from its prompt cache and wrote to it
    # (priced apart; NULL: not reported).
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    latency_ms: int | None = None
    # Money in billionths of the currency's unit (integers add exactly on both databases);
    # NULL with a currency of NULL: the model has no price.
    cost_nanos: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    currency: str | None = Field(default=None, max_length=3)
    # Tokens the provider billed beyond the call's bound (its input bounded, plus max_tokens):
    # a provider that did not honour max_tokens, recorded and reported (`runledger costs`).
    overrun: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    answer: dict[str, Any] | None = _json()
    rejected_at: datetime | None = _ts()
    reuses: int = _count()
    # The reservation the call holds against its job's budget windows, in their unit.
    estimate: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                         server_default="0"))
    budget_period: datetime | None = _ts()
    budget_day: date | None = Field(default=None, sa_column=sa.Column(sa.Date, nullable=True))


class BudgetWindow(SQLModel, table=True):
    """What a job may spend in one window (one of its periods, or one UTC day): the cap, what
    calls in flight have reserved and what answered calls spent, in the budget's unit
    (billionths of ``currency``, or tokens). A reservation is one guarded upsert."""

    __tablename__ = "budget_windows"
    __table_args__ = (
        _check_in("scope", BUDGET_SCOPES, "scope"),
        _check_in("unit", BUDGET_UNITS, "unit"),
        sa.CheckConstraint("cap >= 0", name="cap_non_negative"),
        sa.CheckConstraint("reserved >= 0", name="reserved_non_negative"),
    )

    job: str = Field(primary_key=True, max_length=MAX_CHARS["job"])
    scope: str = Field(primary_key=True, max_length=8)
    window_start: datetime = Field(sa_column=sa.Column(UTCDateTime(), primary_key=True))
    unit: str = Field(max_length=8)
    currency: str | None = Field(default=None, max_length=3)
    cap: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    reserved: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                         server_default="0"))
    spent: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                      server_default="0"))
    calls: int = _count()
    refused: int = _count()
    exhausted_at: datetime | None = _ts()
    updated_at: datetime | None = _ts(nullable=False)


class EndpointLimit(SQLModel, table=True):
    """The shared limits of one named model endpoint, for every worker on every host: what is
    configured (requests and tokens per minute, calls in flight at once; NULL: no limit), the
    adaptive request rate (lowered when the provider refuses, raised again as it answers;
    NULL: none learned yet), the two token buckets' levels when they were last refilled,
    until when the provider asked every worker to pause, and the limits its answers announced
    (all judged by the database clock)."""

    __tablename__ = "endpoint_limits"
    __table_args__ = (
        sa.CheckConstraint("requests_per_minute IS NULL OR requests_per_minute > 0",
                           name="requests_per_minute_positive"),
        sa.CheckConstraint("tokens_per_minute IS NULL OR tokens_per_minute > 0",
                           name="tokens_per_minute_positive"),
        sa.CheckConstraint("max_concurrent IS NULL OR max_concurrent > 0",
                           name="max_concurrent_positive"),
    )

    name: str = Field(primary_key=True, max_length=300)
    requests_per_minute: float | None = Field(
        default=None, sa_column=sa.Column(Real(), nullable=True))
    tokens_per_minute: int | None = Field(
        default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    max_concurrent: int | None = None
    rate: float | None = Field(  # requests per minute allowed now
        default=None, sa_column=sa.Column(Real(), nullable=True))
    request_level: float = Field(default=0.0, sa_column=sa.Column(Real(), nullable=False))
    token_level: float = Field(default=0.0, sa_column=sa.Column(Real(), nullable=False))
    refilled_at: datetime | None = _ts(nullable=False)
    paused_until: datetime | None = _ts()
    refusals: int = _count()  # refusals since the last answer
    granted: bool = False  # whether the last acquisition was granted
    calls: int = _count()
    refused: int = _count()
    updated_at: datetime | None = _ts(nullable=False)
    # What the provider's answers announced (their rate-limit headers), per minute; NULL: none.
    announced_requests_per_minute: float | None = Field(
        default=None, sa_column=sa.Column(Real(), nullable=True))
    announced_tokens_per_minute: int | None = Field(
        default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    answered_at: datetime | None = _ts()  # the endpoint's last answer; NULL: none yet
    probe_at: datetime | None = _ts()  # when the first call of an endpoint knowing no rate left


class SuppressedCost(SQLModel, table=True):
    """What the duplicates a job's ticks suppressed on one UTC day would have cost had they run
    again: each duplicate Run adds its answered calls' stored cost (their tokens and money, per
    currency; '' for calls without a price), measured when the tick suppresses it."""

    __tablename__ = "suppressed_costs"

    job: str = Field(primary_key=True, max_length=MAX_CHARS["job"])
    day: date = Field(sa_column=sa.Column(sa.Date, primary_key=True))
    currency: str = Field(primary_key=True, max_length=3)
    runs: int = _count()
    calls: int = _count()
    tokens: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                       server_default="0"))
    cost_nanos: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                           server_default="0"))
    updated_at: datetime | None = _ts(nullable=False)


runs_table: sa.Table = Run.__table__  # type: ignore[attr-defined]
attempts_table: sa.Table = Attempt.__table__  # type: ignore[attr-defined]
outbox_table: sa.Table = QueuedMessage.__table__  # type: ignore[attr-defined]
delivery_attempts_table: sa.Table = DeliveryAttempt.__table__  # type: ignore[attr-defined]
obligations_table: sa.Table = Obligation.__table__  # type: ignore[attr-defined]
occurrences_table: sa.Table = Occurrence.__table__  # type: ignore[attr-defined]
suppressed_counts_table: sa.Table = SuppressedCount.__table__  # type: ignore[attr-defined]
model_calls_table: sa.Table = ModelCall.__table__  # type: ignore[attr-defined]
budget_windows_table: sa.Table = BudgetWindow.__table__  # type: ignore[attr-defined]
suppressed_costs_table: sa.Table = SuppressedCost.__table__  # type: ignore[attr-defined]
endpoint_limits_table: sa.Table = EndpointLimit.__table__  # type: ignore[attr-defined]

# Table models are built with model_construct when read back (no re-validation); SQLAlchemy
# must have configured their mappers before such an instance's attributes are used.
sa.orm.configure_mappers()
