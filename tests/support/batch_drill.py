"""The processes of the batch-mode kill drill: submitters that tick the drill's job in batch
mode for their periods through the real ``run-job`` flow (each tick queues its calls and
submits them as a batch), and pollers that run the real ``settle-batches`` flow until told to
stop. Started by ``armed.run_armed``, each with a random fault point armed (or none)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from prefect import State
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.jobs import Candidate, Job, Model, OutboxMessage, Period, ValidationFailed
from flows.registry import register
from flows.run_job.flow import run_job
from flows.settle.flow import settle_batches
from store import Ledger

JOB = "batch-drill"
PRICES = {"probe-model": {"input": "2", "output": "8"}}  # USD per million tokens
# Both test servers answer every request with 100 input and 20 output tokens: a call's price at
# the synchronous rate, in billionths of USD; batch mode pays half (the default batch share).
SYNC_COST_NANOS = (100 * 2 + 20 * 8) * 1000
BATCH_COST_NANOS = SYNC_COST_NANOS // 2
UNFINISHED = ("pending", "running")  # a submitter's tick is not done with these


def subjects_of(count: int) -> list[str]:
    return [f"s{i:03d}" for i in range(count)]


def collect(subject: str, period: Period) -> dict[str, Any]:
    return {"subject": subject, "text": f"News about {subject} on {period.label}."}


def transform(raw: dict[str, Any], model: Model) -> Candidate:
    """One model call: in a batch tick it is queued, and replayed once its batch settled."""
    answer = model.generate(raw["text"], system="Summarize.")
    return Candidate(answer.text, answer.model, {"subject": raw["subject"]})


def validate(candidate: Candidate) -> None:
    if not candidate.text:
        raise ValidationFailed("empty summary")


def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
    return [OutboxMessage(f"{subject}@example.com", f"{subject} {period.label}", output["text"])]


def drill_job(subjects: int) -> Job:
    """A daily job of ``subjects`` subjects, one model call and one email per Run. Attempts
    are generous: a tick killed mid-period spends one of each Run it held, and this drill is
    about batches, not about a Run given up after kills."""
    return Job(name=JOB, version="1", cadence="daily", timezone="UTC",
               subjects=subjects_of(subjects), collect=collect, transform=transform,
               validate=validate, messages=messages, max_attempts=50)


def period_done(ledger: Ledger, period: str, subjects: int) -> bool:
    """Every Run of the period exists and none is pending or running: each waits for its batch
    or is completed (the tick that found so also submitted whatever its job had queued)."""
    job = drill_job(subjects)
    the_period = job.parse_period(period)
    runs = ledger.get_many([job.identity(s, the_period).run_id for s in subjects_of(subjects)])
    return len(runs) == subjects and not any(r.status in UNFINISHED for r in runs.values())


def submitter(api: str, subjects: str, periods: str, finished: str) -> None:
    """Tick each period (comma-separated) in batch mode until a tick leaves none of its Runs
    pending or running, then append it to the file ``finished``; a period leased by a dead
    submitter is tried again after the others."""
    count = int(subjects)
    register(drill_job(count))
    pending = periods.split(",")
    # The fork server imported Prefect before this process knew its server.
    with temporary_settings({PREFECT_API_URL: api}), Ledger.connect() as ledger:
        while pending:
            for period in list(pending):
                state: State[Any] = asyncio.run(run_job(  # type: ignore[arg-type]
                    job=JOB, period=period, batch=True, return_state=True))
                if period_done(ledger, period, count):
                    pending.remove(period)
                    with Path(finished).open("a") as done:
                        done.write(period + "\n")
                del state
            if pending:
                time.sleep(0.5)


def poller(api: str, subjects: str, stop: str, polls: str) -> None:
    """settle-batches flow runs until the file ``stop`` exists, or ``polls`` of them (0: no
    bound) have run: an armed poller whose point never comes makes room for another."""
    register(drill_job(int(subjects)))
    most, done = int(polls), 0
    with temporary_settings({PREFECT_API_URL: api}):
        while not Path(stop).exists() and (most == 0 or done < most):
            asyncio.run(settle_batches(return_state=True))  # type: ignore[arg-type]
            done += 1
            time.sleep(0.1)
