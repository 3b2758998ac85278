"""The ledger's tables of model calls and what limits them: the calls, the budget windows they
reserve against, the endpoints' shared limits and what suppressed duplicates would have cost,
as SQLModel classes; Alembic migrations create them (see migrations/)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

import store.batch_tables  # noqa: F401  # the batches a queued call refers to
from store.columns import Real, UTCDateTime, check_in, count, json_doc, ts
from store.identity import MAX_CHARS

# queued: waiting in a provider's batch (neither in flight nor paid until its batch settles it).
CALL_OUTCOMES = ("answered", "refused", "failed", "lost", "queued", "withdrawn")
QUEUED_WHERE = "outcome = 'queued'"
UNBATCHED_WHERE = "outcome = 'queued' AND batch_key IS NULL"  # queued calls no batch holds
BUDGET_UNITS = ("money", "tokens")
BUDGET_SCOPES = ("period", "day")


class ModelCall(SQLModel, table=True):
    """One request to a model endpoint on behalf of an Attempt: recorded (fenced) before it
    leaves the process; its outcome is NULL while it is in flight, ``queued`` while it waits in
    a provider's batch (``store.batches``). An answered call holds the Run's checkpoint of that
    position in the transform (``answer``), reused by a later attempt whose prompt has the same
    digest, unless validation rejected it (``rejected_at``)."""

    __tablename__ = "model_calls"
    __table_args__ = (
        sa.Index("ix_model_calls_run_position", "run_id", "position"),
        sa.Index("ix_model_calls_started_at", "started_at"),
        # The endpoint limiter counts the calls in flight of an endpoint.
        sa.Index("ix_model_calls_in_flight", "endpoint", "started_at",
                 postgresql_where=sa.text("outcome IS NULL"),
                 sqlite_where=sa.text("outcome IS NULL")),
        # A Run queues a call (position, prompt) once, even after a crash between queueing it
        # and waiting for its batch.
        sa.Index("uq_model_calls_queued", "run_id", "position", "prompt_digest", unique=True,
                 postgresql_where=sa.text(QUEUED_WHERE), sqlite_where=sa.text(QUEUED_WHERE)),
        # A submitter takes an endpoint's queued calls that no batch holds, oldest first.
        sa.Index("ix_model_calls_unbatched", "endpoint", "job", "started_at",
                 postgresql_where=sa.text(UNBATCHED_WHERE),
                 sqlite_where=sa.text(UNBATCHED_WHERE)),
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
    started_at: datetime | None = ts(nullable=False)
    finished_at: datetime | None = ts()
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
    # A call answered through a provider's batch: what it would have cost synchronously (its
    # saving is that less ``cost_nanos``); NULL for any other call.
    sync_cost_nanos: int | None = Field(default=None,
                                        sa_column=sa.Column(sa.BigInteger, nullable=True))
    answer: dict[str, Any] | None = json_doc()
    rejected_at: datetime | None = ts()
    reuses: int = count()
    # The reservation the call holds against its job's budget windows, in their unit.
    estimate: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                         server_default="0"))
    budget_period: datetime | None = ts()
    budget_day: date | None = Field(default=None, sa_column=sa.Column(sa.Date, nullable=True))
    # A call queued for a provider's batch: the batch that holds it (NULL: none yet, or its
    # batch ended without its answer), the id of its line in the batch's file, and the request
    # body the line sends, and the flow run of the tick that queued it (whose story ends when
    # none of its calls waits).
    batch_key: str | None = Field(
        default=None, sa_column=sa.Column(sa.String(64), sa.ForeignKey("batches.batch_key"),
                                          nullable=True))
    custom_id: str | None = Field(default=None, max_length=64)
    request: dict[str, Any] | None = json_doc()
    flow_run_id: str | None = Field(default=None, max_length=36)
    # A queued call's prompt tokens (bounded from above): what it holds of its provider's queue
    # of enqueued batch tokens while its batch is open or submitted.
    queued_tokens: int | None = None


class BudgetWindow(SQLModel, table=True):
    """What a job may spend in one window (one of its periods, or one UTC day): the cap, what
    calls in flight have reserved and what answered calls spent, in the budget's unit
    (billionths of ``currency``, or tokens). A reservation is one guarded upsert."""

    __tablename__ = "budget_windows"
    __table_args__ = (
        check_in("scope", BUDGET_SCOPES, "scope"),
        check_in("unit", BUDGET_UNITS, "unit"),
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
    calls: int = count()
    refused: int = count()
    exhausted_at: datetime | None = ts()
    updated_at: datetime | None = ts(nullable=False)


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
    refilled_at: datetime | None = ts(nullable=False)
    paused_until: datetime | None = ts()
    refusals: int = count()  # refusals since the last answer
    granted: bool = False  # whether the last acquisition was granted
    calls: int = count()
    refused: int = count()
    updated_at: datetime | None = ts(nullable=False)
    # What the provider's answers announced (their rate-limit headers), per minute; NULL: none.
    announced_requests_per_minute: float | None = Field(
        default=None, sa_column=sa.Column(Real(), nullable=True))
    announced_tokens_per_minute: int | None = Field(
        default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    answered_at: datetime | None = ts()  # the endpoint's last answer; NULL: none yet
    probe_at: datetime | None = ts()  # when the first call of an endpoint knowing no rate left


class SuppressedCost(SQLModel, table=True):
    """What the duplicates a job's ticks suppressed on one UTC day would have cost had they run
    again: each duplicate Run adds its answered calls' stored cost (their tokens and money, per
    currency; '' for calls without a price), measured when the tick suppresses it."""

    __tablename__ = "suppressed_costs"

    job: str = Field(primary_key=True, max_length=MAX_CHARS["job"])
    day: date = Field(sa_column=sa.Column(sa.Date, primary_key=True))
    currency: str = Field(primary_key=True, max_length=3)
    runs: int = count()
    calls: int = count()
    tokens: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                       server_default="0"))
    cost_nanos: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False,
                                                           server_default="0"))
    updated_at: datetime | None = ts(nullable=False)



model_calls_table: sa.Table = ModelCall.__table__  # type: ignore[attr-defined]
budget_windows_table: sa.Table = BudgetWindow.__table__  # type: ignore[attr-defined]
suppressed_costs_table: sa.Table = SuppressedCost.__table__  # type: ignore[attr-defined]
endpoint_limits_table: sa.Table = EndpointLimit.__table__  # type: ignore[attr-defined]

# Table models are built with model_construct when read back (no re-validation); SQLAlchemy
# must have configured their mappers before such an instance's attributes are used.
sa.orm.configure_mappers()
