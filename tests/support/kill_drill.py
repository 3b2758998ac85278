"""The processes of the SIGKILL drill: tick workers that run the drill's job (the reference job
with a budget) for their periods through the real ``run-job`` flow until each tick finished
every subject, and dispatchers that deliver the outbox until told to stop. Started by
``armed.run_armed``, each with a random fault point armed (or none)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from prefect import State
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.delivery.policy import RetryPolicy
from flows.jobs import Job
from flows.jobs.budget import Budget
from flows.jobs.competitor_summary import job as competitor_summary
from flows.registry import register
from flows.run_job.flow import run_job
from flows.run_job.outcomes import TickReport
from store import Ledger
from tests.support.fault_walk import delivery_pass

JOB = "kill-drill-summary"
# What each call reserves, in USD: ten times the bound of a call about the sample data (its
# documents' bytes as tokens plus max_tokens, priced by cap_probe.PRICES), so every call
# reserves exactly this and a call lost in flight is charged it.
CALL_ESTIMATE = Decimal("0.05")
SMTP_TIMEOUT = 0.5
DELIVERY_LEASE = 4.0  # at least twice 3 x SMTP_TIMEOUT
POLICY = RetryPolicy(max_attempts=8, base_delay=0.05, max_delay=0.2, max_window=3600)


def drill_job(kills: int) -> Job:
    """The reference job under the drill's own name, with a budget per period of its two Runs'
    calls plus two lost calls per kill: more than any period can spend (a kill loses at most
    the calls in flight, one per subject), so it never refuses, and the drill judges that every
    call is accounted in it and none passed it."""
    cap = CALL_ESTIMATE * 2 * (1 + kills)
    return replace(competitor_summary, name=JOB,
                   budget=Budget(per_period=cap, call_estimate=CALL_ESTIMATE))


def tick_worker(api: str, kills: str, periods: str, finished: str) -> None:
    """Tick each period (comma-separated) until a tick finds every subject completed, then
    append it to the file ``finished``; a period leased by a dead worker is tried again after
    the others. ``kills``: the drill's K, which sizes its job's budget."""
    register(drill_job(int(kills)))
    pending = periods.split(",")
    # The fork server imported Prefect before this process knew its server.
    with temporary_settings({PREFECT_API_URL: api}):
        while pending:
            for period in list(pending):
                state: State[Any] = asyncio.run(run_job(  # type: ignore[arg-type]
                    job=JOB, period=period, return_state=True))
                report = state.result(raise_on_failure=False)
                if isinstance(report, TickReport) and report.completed_every_subject():
                    pending.remove(period)
                    with Path(finished).open("a") as done:
                        done.write(period + "\n")
            if pending:
                time.sleep(0.5)


def dispatcher(url: str, host: str, port: str, stop: str) -> None:
    """Delivery passes until the file ``stop`` exists."""
    with Ledger.connect(url) as ledger:
        while not Path(stop).exists():
            delivery_pass(ledger, host, int(port), timeout=SMTP_TIMEOUT, lease=DELIVERY_LEASE,
                          policy=POLICY, mark_batch=5, batch_size=10)
            time.sleep(0.1)
