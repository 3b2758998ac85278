"""Endpoint limits: how fast every worker together may call one named model endpoint, judged
by the database clock. Two token buckets (requests, refilled at the endpoint's current rate;
tokens, at its tokens per minute), a bound on the calls in flight (its model calls with no
outcome yet, started within the model timeout: a worker killed mid-call frees its slot when
that timeout passes, no lease to leak) and a pause the provider asked for (a 429's
Retry-After), for every worker at once.

Acquiring is one guarded statement: it refills both buckets by the database time elapsed and,
only if the endpoint is not paused, both buckets hold the call's share and fewer calls than
the maximum are in flight, takes the share; it returns the levels either way, from which
``SlotDecision.wait_seconds`` says how long to wait before asking again. It runs in the
transaction that records the call in flight (``model_calls``), so that the count of calls in
flight the next acquisition reads includes this one. The rate adapts: a refusal cuts it by 30% (once
per pause: the calls refused together are one signal), each answer raises it by a step, up to
the configured rate (AIMD, as TCP's congestion window); an endpoint with no configured rate
learns one from its first refusal
(the calls it made in the last ``OBSERVED_SECONDS``).

The provider's answers announce limits too, which the endpoint adopts: ``store.announced_limits``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.call_tables import EndpointLimit, endpoint_limits_table, model_calls_table
from store.dialect import db_now, greatest, least, seconds_since, upsert
from store.errors import InvalidInput, RunledgerError
from store.statement import EVERYWHERE, Statement, param, transition

limits = endpoint_limits_table
calls = model_calls_table
BURST_SECONDS = 1.0  # a bucket holds one second's worth: no minute's worth in one burst
# A refusal multiplies the rate by this: a provider refusing at the configured rate is mostly
# the jitter of arrivals, and halving cost 13 % of a 2,000-call tick (bench/throughput.py).
DECREASE = 0.7
# Each second's worth of answers adds this share of the configured (else the current) rate:
# additive, so that an endpoint cut by a refusal climbs back in about 10 s.
INCREASE_SHARE = 0.03
MIN_RATE = 6.0  # requests per minute a refused endpoint keeps
OBSERVED_SECONDS = 10.0  # the window an unconfigured endpoint's first refusal measures
MAX_BACKOFF_STEPS = 5  # no Retry-After: pause 1, 2, 4 ... 32 s (within the cap)
MAX_NAME = 300
# The probe's call is recorded within this long of its slot (a statement of its own after it):
# until then no call in flight is the probe not yet recorded, not a probe that ended.
PROBE_RECORD_SECONDS = 1.0


def positive(value: float | None, name: str) -> float | None:
    """A limit is a finite number greater than 0, or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
            or value != value or value == float("inf"):
        raise InvalidInput(f"an endpoint's {name} must be a number greater than 0 (or None: no "
                           f"limit), got {value!r}")
    return value


@dataclass(frozen=True)
class Limits:
    """What an endpoint allows: requests and tokens per minute and calls in flight at once,
    each None for no limit."""

    requests_per_minute: float | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        positive(self.requests_per_minute, "requests per minute")
        positive(self.tokens_per_minute, "tokens per minute")
        positive(self.max_concurrent, "max concurrent")
        for name in ("tokens_per_minute", "max_concurrent"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), int):
                raise InvalidInput(f"an endpoint's {name.replace('_', ' ')} must be a whole "
                                   f"number, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Slot:
    """A call's share of its endpoint's limits: one request and ``tokens`` (its estimate);
    calls of the endpoint without an outcome that started within ``in_flight_seconds`` (the
    model timeout) count as in flight. An endpoint that ``bounds_in_flight`` has the slot
    taken in the transaction that records the call (the count must include every call recorded
    before); any other has it taken first, in a statement of its own (``take_slot_txn``)."""

    endpoint: str
    tokens: int
    in_flight_seconds: float
    bounds_in_flight: bool = False

    def __post_init__(self) -> None:
        check_name(self.endpoint)
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 0:
            raise InvalidInput(f"a call's token estimate must be an integer of 0 or more, "
                               f"got {self.tokens!r}")
        positive(self.in_flight_seconds, "in-flight window")


@dataclass(frozen=True)
class SlotDecision:
    """What one asking for a slot found, on the database clock ``now``: ``granted``, or the
    state that says how long to wait (``wait_seconds``)."""

    granted: bool
    now: datetime
    paused_until: datetime | None
    rate: float | None  # requests per minute
    request_level: float
    tokens_per_minute: int | None
    token_level: float
    tokens: int  # the call's share of the tokens bucket

    def wait_seconds(self, poll: float) -> float:
        """How long to wait before asking again: until the pause ends, else until both
        buckets hold the call's share; ``poll`` when only the calls in flight are too many
        (one ends when it ends). 0 when granted."""
        if self.granted:
            return 0.0
        if self.paused_until is not None and self.paused_until > self.now:
            return (self.paused_until - self.now).total_seconds()
        waits = [0.0]
        if self.rate is not None and self.request_level < 1:
            waits.append((1 - self.request_level) / (self.rate / 60))
        if self.tokens_per_minute is not None:
            needed = min(float(self.tokens), self.tokens_per_minute / 60 * BURST_SECONDS)
            if self.token_level < needed:
                waits.append((needed - self.token_level) / (self.tokens_per_minute / 60))
        longest = max(waits)
        return longest if longest > 0 else poll


class SlotUnavailable(RunledgerError):
    """The endpoint's limits allow no call now; nothing was recorded or reserved. Ask again
    after ``decision.wait_seconds``."""

    def __init__(self, decision: SlotDecision) -> None:
        super().__init__(f"endpoint limits allow no call for {decision.wait_seconds(0):.3f} s")
        self.decision = decision


def capacity(per_minute: Any) -> Any:
    """A bucket's size: one burst's worth of ``per_minute``, at least 1."""
    return greatest(per_minute / 60.0 * BURST_SECONDS, sa.literal(1.0))


def lower(first: Any, second: Any) -> Any:
    """The lower of two limits, either NULL for none (SQLite's min() of a NULL is NULL)."""
    return sa.case((first.is_(None), second), (second.is_(None), first),
                   (second < first, second), else_=first)


def tokens_limit() -> Any:
    """The tokens per minute in force: the lower of the configured and the announced."""
    return lower(limits.c.tokens_per_minute, limits.c.announced_tokens_per_minute)


def _configure(d: str) -> Any:
    # Typed: PostgreSQL cannot infer the type of a NULL parameter inside an expression.
    rpm = sa.cast(param(limits.c.requests_per_minute), sa.Float())
    tpm = sa.cast(param(limits.c.tokens_per_minute), sa.BigInteger())
    insert = upsert(d, limits).values(
        name=param(limits.c.name), requests_per_minute=rpm, tokens_per_minute=tpm,
        max_concurrent=param(limits.c.max_concurrent), rate=rpm,
        request_level=sa.case((rpm.is_(None), 0.0), else_=capacity(rpm)),
        token_level=sa.case((tpm.is_(None), 0.0), else_=capacity(tpm)), refilled_at=db_now(),
        refusals=0, granted=False, calls=0, refused=0, updated_at=db_now())
    given = insert.excluded
    return insert.on_conflict_do_update(
        index_elements=[limits.c.name],
        set_={"requests_per_minute": given.requests_per_minute,
              "tokens_per_minute": given.tokens_per_minute,
              "max_concurrent": given.max_concurrent,
              # A new configured rate starts over; the same one keeps what was learned.
              "rate": sa.case((limits.c.requests_per_minute.is_not_distinct_from(
                  given.requests_per_minute), limits.c.rate), else_=given.rate),
              "updated_at": given.updated_at},
    )


_CONFIGURE = Statement(
    "configure_endpoint_limit", "Create an endpoint's limits (buckets full) or replace its "
    "configured ones; the adaptive rate starts over only when the configured rate changes.",
    _configure)


def _refilled(level: Any, per_minute: Any) -> Any:
    elapsed = greatest(seconds_since(limits.c.refilled_at), sa.literal(0.0))
    return sa.case((per_minute.is_(None), 0.0),  # no limit: an empty bucket nobody reads
                   else_=least(capacity(per_minute), level + elapsed * per_minute / 60.0))


def _acquire(d: str) -> Any:
    # Every value is computed from the updated row itself, never from a subquery over it: when
    # another statement updates the row first, PostgreSQL recomputes an UPDATE's expressions
    # on the row's new version but reuses a joined subquery's stale one (two slots from one).
    tokens = sa.bindparam("tokens", type_=sa.BigInteger())
    window = sa.bindparam("in_flight_seconds", type_=sa.Float())
    in_flight = (
        sa.select(sa.func.count()).select_from(calls)
        .where(calls.c.endpoint == limits.c.name, calls.c.outcome.is_(None),
               calls.c.started_at > db_now(-window))
        .scalar_subquery())
    tpm = tokens_limit()
    requests = _refilled(limits.c.request_level, limits.c.rate)
    token_level = _refilled(limits.c.token_level, tpm)
    # With nothing configured, nothing learned and no answer yet, one call goes first (the
    # probe) and the others wait for its answer to announce the provider's limits: while it
    # is in flight, within the model timeout.
    learning = sa.and_(limits.c.requests_per_minute.is_(None),
                       limits.c.tokens_per_minute.is_(None), limits.c.max_concurrent.is_(None),
                       limits.c.rate.is_(None), limits.c.answered_at.is_(None))
    probe_age = seconds_since(limits.c.probe_at)
    probing = sa.and_(learning, limits.c.probe_at.is_not(None), probe_age < window,
                      sa.or_(probe_age < PROBE_RECORD_SECONDS, in_flight > 0))
    ok = sa.and_(
        sa.or_(limits.c.paused_until.is_(None), limits.c.paused_until <= db_now()),
        sa.or_(limits.c.max_concurrent.is_(None), in_flight < limits.c.max_concurrent),
        sa.or_(limits.c.rate.is_(None), requests >= 1.0),
        sa.or_(tpm.is_(None),
               token_level >= least(sa.cast(tokens, sa.Float()), tpm / 60.0 * BURST_SECONDS)),
        sa.not_(probing),
    )
    took = sa.case((ok, 1), else_=0)
    # RETURNING names the two tokens limits, not the lower of them: SQLite (3.40) returns NULL
    # for that CASE beside the subquery counting the calls in flight.
    return (
        sa.update(limits)
        .where(limits.c.name == param(limits.c.name))
        .values(request_level=requests - took, token_level=token_level - took * tokens,
                refilled_at=db_now(), granted=ok, calls=limits.c.calls + took,
                probe_at=sa.case((sa.and_(ok, learning), db_now()), else_=limits.c.probe_at),
                updated_at=db_now())
        .returning(limits.c.granted, limits.c.refilled_at, limits.c.paused_until,
                   limits.c.rate, limits.c.request_level, limits.c.tokens_per_minute,
                   limits.c.announced_tokens_per_minute,
                   limits.c.token_level)
    )


# PostgreSQL: the row is locked before the acquisition reads the calls in flight, so that its
# snapshot holds every call recorded by the acquisitions before it (a statement waiting on the
# row lock would count from the snapshot it took before waiting). SQLite's BEGIN IMMEDIATE
# already holds the whole database.
_LOCK = Statement(
    "lock_endpoint_limit", "Lock an endpoint's limits row until the transaction ends.",
    lambda d: sa.select(limits.c.name).where(limits.c.name == param(limits.c.name))
    .with_for_update(), dialects=("postgresql",))

_ACQUIRE = Statement(
    "acquire_endpoint_slot", "Refill the endpoint's buckets by the database time elapsed and "
    "take one request and the call's tokens, only if the endpoint is not paused, both buckets "
    "hold them, fewer calls than its maximum are in flight and no probe is awaited (knowing no "
    "rate, one call waits for its answer); the levels are returned either way (how long to "
    "wait).", _acquire)


def _observed_rate() -> Any:
    """Requests per minute the endpoint's calls of the last OBSERVED_SECONDS made."""
    counted = (sa.select(sa.func.count()).select_from(calls)
               .where(calls.c.endpoint == param(limits.c.name),
                      calls.c.started_at > db_now(-OBSERVED_SECONDS))
               .scalar_subquery())
    return sa.cast(counted, sa.Float()) * (60.0 / OBSERVED_SECONDS)


def _refuse(d: str) -> Any:
    pause = sa.cast(sa.bindparam("pause_seconds", type_=sa.Float()), sa.Float())
    cap = sa.bindparam("max_pause_seconds", type_=sa.Float())
    backoff = sa.case(*((limits.c.refusals == n, float(2**n)) for n in range(MAX_BACKOFF_STEPS)),
                      else_=float(2**MAX_BACKOFF_STEPS))
    seconds = least(sa.func.coalesce(pause, backoff), cap)
    not_paused = sa.or_(limits.c.paused_until.is_(None), limits.c.paused_until <= db_now())
    cut = greatest(sa.func.coalesce(limits.c.rate, _observed_rate()) * DECREASE,
                      sa.literal(MIN_RATE))
    return (
        sa.update(limits)
        .where(limits.c.name == param(limits.c.name))
        .values(rate=sa.case((not_paused, cut), else_=limits.c.rate),
                paused_until=greatest(sa.func.coalesce(limits.c.paused_until, db_now()),
                                      db_now(seconds)),
                request_level=0.0,
                token_level=sa.case(
                    (tokens_limit().is_(None), 0.0),
                    else_=limits.c.token_level + sa.bindparam("tokens", type_=sa.BigInteger())),
                refusals=limits.c.refusals + 1, refused=limits.c.refused + 1,
                updated_at=db_now())
        .returning(limits.c.paused_until, limits.c.rate)
    )


_REFUSE = Statement(
    "refuse_endpoint", "The provider refused a call: pause the endpoint for every worker until "
    "the time it named (else a backoff doubling per refusal), both capped, never shortening "
    "a pause; cut the rate by 30% once per pause (learning one from the calls just made when none "
    "is known); give back the call's tokens.", _refuse)


_READ = Statement(
    "read_endpoint_limit", "An endpoint's limits and their state.",
    lambda d: sa.select(limits).where(limits.c.name == param(limits.c.name)))


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise InvalidInput(f"an endpoint's name must be non-empty text of at most {MAX_NAME} "
                           f"characters, got {name!r}")
    return name


@transition(one_statement_on=EVERYWHERE)
def configure_txn(conn: Connection, name: str, given: Limits) -> None:
    """Create the endpoint's limits, or replace the configured ones (see ``_CONFIGURE``)."""
    _CONFIGURE.rows(conn, name=check_name(name), requests_per_minute=given.requests_per_minute,
                    tokens_per_minute=given.tokens_per_minute,
                    max_concurrent=given.max_concurrent)


def take_slot_with_record(conn: Connection, slot: Slot) -> SlotDecision:
    """Take a call's slot of its endpoint if the limits allow one now (a step of the
    transaction that records the call in flight: the endpoint bounds its calls in flight, and
    their count must include every call recorded before, so its row is locked first)."""
    if conn.dialect.name in _LOCK.dialects:
        _LOCK.rows(conn, name=slot.endpoint)
    return _take(conn, slot)


@transition(one_statement_on=EVERYWHERE)
def take_slot_txn(conn: Connection, slot: Slot) -> SlotDecision:
    """Take a call's slot of an endpoint that does not bound its calls in flight, in one
    statement of its own: the row is held only while the statement runs, not for the round
    trips of recording the call, which follows in a transaction of its own."""
    return _take(conn, slot)


def _take(conn: Connection, slot: Slot) -> SlotDecision:
    row = _ACQUIRE.first(conn, name=slot.endpoint, tokens=slot.tokens,
                         in_flight_seconds=slot.in_flight_seconds)
    if row is None:
        raise InvalidInput(f"endpoint {slot.endpoint!r} has no limits in the ledger: configure "
                           "it first (Ledger.calls.configure_endpoint)")
    return SlotDecision(bool(row["granted"]), row["refilled_at"], row["paused_until"],
                        row["rate"], row["request_level"],
                        _lower_of(row["tokens_per_minute"], row["announced_tokens_per_minute"]),
                        row["token_level"], slot.tokens)


@transition(one_statement_on=EVERYWHERE)
def refuse_txn(conn: Connection, name: str, tokens: int, pause_seconds: float | None,
               max_pause_seconds: float) -> datetime | None:
    """Pause the endpoint after a provider's refusal (see ``_REFUSE``); until when."""
    row = _REFUSE.first(conn, name=name, tokens=tokens, pause_seconds=pause_seconds,
                        max_pause_seconds=max_pause_seconds)
    return None if row is None else row["paused_until"]


def _lower_of(first: int | None, second: int | None) -> int | None:
    """The lower of two limits, either None for none (as ``lower``)."""
    return first if second is None else second if first is None else min(first, second)


def read_limit(conn: Connection, name: str) -> EndpointLimit | None:
    """The endpoint's limits and their state, if it has any."""
    row = _READ.first(conn, name=name)
    return None if row is None else EndpointLimit.model_construct(**row)
