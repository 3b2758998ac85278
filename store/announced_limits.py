"""Announced limits: what an endpoint adopts from the provider's answers.

The provider's answers announce its limits (``Announcement``, from their rate-limit headers):
each answer writes them into the row, so that every worker, and every process started later,
runs at them. The request rate and the tokens per minute in force are the lower of the
configured and the announced ones (an endpoint with nothing configured adopts the announced
ones; a configured limit lower than the announced one wins); an announcement that the
provider's quota is nearly spent pauses the endpoint until the quota resets, before the
provider has to refuse. Until an endpoint with nothing configured and no rate learned has its
first answer, it sends one call at a time (``probe_at``): a tick's first crowd of calls would
otherwise leave before any answer could announce what the provider allows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.call_tables import endpoint_limits_table
from store.dialect import db_now, greatest, least
from store.endpoint_limits import INCREASE_SHARE, capacity, lower, positive, tokens_limit
from store.errors import InvalidInput
from store.statement import EVERYWHERE, Statement, param, transition

limits = endpoint_limits_table


@dataclass(frozen=True)
class Announcement:
    """What one answer's rate-limit headers announced, as the endpoint's row takes it: the
    requests and tokens per minute the provider allows, the requests and tokens it has left,
    and how long every worker pauses before the provider would have to refuse (each None:
    not announced; no pause)."""

    requests_per_minute: float | None = None
    tokens_per_minute: int | None = None
    requests_remaining: int | None = None
    tokens_remaining: int | None = None
    pause_seconds: float | None = None

    def __post_init__(self) -> None:
        positive(self.requests_per_minute, "announced requests per minute")
        positive(self.tokens_per_minute, "announced tokens per minute")
        for name in ("requests_remaining", "tokens_remaining", "pause_seconds"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value >= 0
                                      or value == float("inf")):
                raise InvalidInput(f"an announcement's {name.replace('_', ' ')} must be a "
                                   f"finite number of 0 or more, got {value!r}")


def _answered(d: str) -> Any:
    def given(name: str, kind: Any) -> Any:  # typed: a NULL parameter inside an expression
        return sa.cast(sa.bindparam(name, type_=kind), kind)

    rate = limits.c.rate
    announced_rpm = sa.func.coalesce(given("announced_rpm", sa.Float()),
                                     limits.c.announced_requests_per_minute)
    announced_tpm = sa.func.coalesce(given("announced_tpm", sa.BigInteger()),
                                     limits.c.announced_tokens_per_minute)
    ceiling = lower(limits.c.requests_per_minute, announced_rpm)
    # An answer's share of a second's increase: the rate's answers of a second add it all.
    step = sa.func.coalesce(ceiling, rate) * (INCREASE_SHARE * 60.0) / rate
    raised = rate + step  # NULL (nothing learned, no limit) stays NULL
    new_rate = sa.case((rate.is_(None), ceiling),  # nothing learned: adopt what is announced
                       (sa.and_(ceiling.is_not(None), raised > ceiling), ceiling), else_=raised)
    tpm, new_tpm = tokens_limit(), lower(limits.c.tokens_per_minute, announced_tpm)
    requests_left = given("requests_remaining", sa.Float())
    tokens_left = given("tokens_remaining", sa.Float())
    pause = given("pause_seconds", sa.Float())
    return (
        sa.update(limits)
        .where(limits.c.name == param(limits.c.name))
        .values(token_level=sa.case(
                    (new_tpm.is_(None), 0.0),
                    # A tokens limit newly in force: its bucket holds what the provider has left.
                    (tpm.is_(None), least(capacity(new_tpm),
                                          sa.func.coalesce(tokens_left, capacity(new_tpm)))),
                    else_=limits.c.token_level + sa.bindparam("estimate", type_=sa.BigInteger())
                    - sa.bindparam("used", type_=sa.BigInteger())),
                request_level=sa.case(
                    (sa.and_(rate.is_(None), new_rate.is_not(None)),
                     least(capacity(new_rate),
                           sa.func.coalesce(requests_left, capacity(new_rate)))),
                    else_=limits.c.request_level),
                rate=new_rate,
                announced_requests_per_minute=announced_rpm,
                announced_tokens_per_minute=announced_tpm,
                paused_until=sa.case(
                    (pause.is_(None), limits.c.paused_until),
                    else_=greatest(sa.func.coalesce(limits.c.paused_until, db_now()),
                                   db_now(pause))),
                answered_at=db_now(), refusals=0, updated_at=db_now())
    )


_ANSWERED = Statement(
    "settle_endpoint_call", "An answered call settles the tokens it took to what it used, "
    "records the limits it announced, and raises the endpoint's rate by its share of a "
    "second's step, up to the lower of the configured and the announced rate (a rate not yet "
    "known adopts it at once); a nearly spent quota pauses the endpoint, never shortening a "
    "pause.", _answered)


@transition(one_statement_on=EVERYWHERE)
def answered_txn(conn: Connection, name: str, estimate: int, used: int,
                 announced: Announcement | None = None) -> None:
    """Settle an answered call's tokens, take in what it announced and raise the endpoint's
    rate (see ``_ANSWERED``)."""
    a = announced or Announcement()
    _ANSWERED.rows(conn, name=name, estimate=estimate, used=used,
                   announced_rpm=a.requests_per_minute, announced_tpm=a.tokens_per_minute,
                   requests_remaining=a.requests_remaining, tokens_remaining=a.tokens_remaining,
                   pause_seconds=a.pause_seconds)
