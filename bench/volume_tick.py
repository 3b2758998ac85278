"""The flow-run process of drill 5: one tick of a job of N subjects through the real ``run-job``
flow (offline model, the ledger and Prefect server its environment names), in a process of its
own so that the drill can read its peak RSS. Prints one JSON line: the flow run's id and final
state, the tick's outcomes by count, how many ``runledger.run.*`` events it emitted, and the
most events it held unsent at once.

    python -m bench.volume_tick JOB_NAME SUBJECTS PERIOD"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flows.jobs import Candidate, Job
from flows.model import Model
from flows.registry import register
from flows.run_job.outcomes import outcome_name
from store import OutboxMessage, Period

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from prefect.client.schemas.objects import State

RECIPIENT = "ops@volume.example.org"


def subject_names(size: int) -> list[str]:
    return [f"s{i:05d}" for i in range(size)]


def volume_job(name: str, size: int) -> Job:
    """A daily job of ``size`` subjects: a short text each, summarized by the model, one email."""

    def collect(subject: str, period: Period) -> dict[str, Any]:
        return {"subject": subject, "text": f"{subject} raised its prices on {period.label}. "
                "Customers were told by email. The change starts next month."}

    def transform(raw: dict[str, Any], model: Model) -> Candidate:
        answer = model.generate(raw["text"], system="Summarize.")
        return Candidate(answer.text, answer.model, {"subject": raw["subject"]})

    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return [OutboxMessage(RECIPIENT, f"{subject} {period.label}", output["text"])]

    return Job(name=name, version="1", cadence="daily", timezone="UTC",
               subjects=subject_names(size), collect=collect, transform=transform,
               validate=lambda candidate: None, messages=messages)


def vm_hwm_kib() -> int:
    """This process's peak resident set so far (/proc/self/status VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main(name: str, size: int, period: str) -> None:
    from flows.run_job.flow import run_job
    from flows.run_job.outcomes import TickReport, unsent_events

    register(volume_job(name, size))
    most, done = [0], threading.Event()

    def sample() -> None:  # the most events this process held unsent at once
        while not done.wait(0.05):
            most[0] = max(most[0], unsent_events())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # Prefect types an async flow's call as an Awaitable; it is the coroutine asyncio.run takes.
    state = asyncio.run(cast("Coroutine[Any, Any, State[Any]]",
                             run_job(job=name, period=period, return_state=True)))
    done.set()
    sampler.join()
    report = state.result(raise_on_failure=False)
    counts = dict(report.counts()) if isinstance(report, TickReport) else {}
    print(json.dumps({
        "flow_run_id": str(state.state_details.flow_run_id), "state": outcome_name(state),
        "message": state.message, "outcomes": counts,
        # One runledger.run.* event per subject outcome (Tick.emit).
        "run_events": sum(counts.values()), "vm_hwm_kib": vm_hwm_kib(),
        "most_unsent_events": most[0],
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
