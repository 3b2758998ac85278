"""Prefect's limits a backfill runs under: a global concurrency limit ``backfill-<job>`` holds
``max_active`` periods at once, a decaying one ``backfill-<job>:rate`` spaces their starts;
both are shared by every backfill of the job and editable in the UI."""

from __future__ import annotations

from dataclasses import dataclass

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
)
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from flows.backfill.request import Request


@dataclass(frozen=True)
class Limits:
    """The names of the Prefect global concurrency limits a backfill of a job runs under."""

    active: str
    rate: str | None


def limit_names(job: str) -> tuple[str, str]:
    """``backfill-<job>`` and ``backfill-<job>:rate`` (a job name has no colon: no clash)."""
    return f"backfill-{job}", f"backfill-{job}:rate"


async def configure_limits(request: Request) -> Limits:
    """Create or update the job's backfill limits on the Prefect server.

    Read in Prefect 3.9's source (``server/models/concurrency_limits_v2.py``,
    ``server/api/concurrency_limits_v2.py``, ``concurrency/services.py``):

    * ``concurrency(name)`` takes a slot with a 300 s lease (renewed by a thread while held,
      given back on exit, back by itself after a crash) and, while the limit is full, retries
      on the server's 423 after its Retry-After (the average slot occupancy, capped at 30 s);
      one queue per limit name in this process keeps the waiters in order.
    * ``rate_limit(name)`` takes a slot that is never given back: the server lets occupied
      slots decay by ``floor(slot_decay_per_second * seconds since the limit last changed)``,
      and a refused attempt also counts as a change. With ``limit=1`` and a decay of
      rate/60 per second, starts are at least 60/rate seconds apart, never closer.
    * A limit with ``active=False`` is not enforced at all, so an update sets it active.
    """
    active, rate = limit_names(request.job.name)
    async with get_client() as client:
        for name, limit, decay in [(active, request.max_active, 0.0),
                                   (rate, 1, (request.rate_per_minute or 0) / 60)]:
            if name == rate and request.rate_per_minute is None:
                continue
            update = GlobalConcurrencyLimitUpdate(limit=limit, active=True,
                                                  slot_decay_per_second=decay)
            try:
                await client.update_global_concurrency_limit(name, update)
            except ObjectNotFound:
                try:
                    await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                        name=name, limit=limit, slot_decay_per_second=decay))
                except ObjectAlreadyExists:  # another backfill of the job created it first
                    await client.update_global_concurrency_limit(name, update)
    return Limits(active, rate if request.rate_per_minute is not None else None)
