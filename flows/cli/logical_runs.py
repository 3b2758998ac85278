"""A logical Run as an operator reads it: its key, its period in the job's
timezone and in UTC, its attempt numbers, its input version, how long it took, where its output
came from in Prefect, and its final state. `runs show` and `runs list --json` print this."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfo

from store import Attempt, Run, RunledgerError, document_digest

if TYPE_CHECKING:
    from flows.jobs import Job


class OfPeriod(Protocol):
    """What names a job's period: a Run, an unfinished Run, a batch's tick."""

    @property
    def job(self) -> str: ...

    @property
    def period_start(self) -> datetime: ...


@cache
def _job(name: str) -> Job | None:
    from flows.registry import get_job

    try:
        return get_job(name)
    except RunledgerError:
        return None


def _period_of(run: OfPeriod) -> tuple[Job, Any] | None:
    """The Run's job and Period, when the job is registered here and its cadence still starts a
    period at the Run's period start."""
    job = _job(run.job)
    if job is None:
        return None
    period = job.period_at(run.period_start)
    return (job, period) if period.start == run.period_start else None


def period_label(run: OfPeriod) -> str:
    """The Run's period as its user names it, the label of its start in the job's timezone
    (``2026-12-01``, ``2026-12-01T09:00+01:00``); in UTC when the job is not registered here
    or its cadence no longer starts a period there."""
    found = _period_of(run)
    if found is not None:
        return str(found[1].label)
    return run.period_start.astimezone(UTC).isoformat(timespec="minutes")


def period_fields(run: Run) -> dict[str, Any]:
    """The Run's period: its label, start and end in the job's timezone and in UTC (only the
    UTC start when the job is unknown here: its end needs the cadence)."""
    found = _period_of(run)
    if found is None:
        return {"label": period_label(run), "timezone": None, "start": None, "end": None,
                "start_utc": run.period_start.astimezone(UTC).isoformat(), "end_utc": None}
    job, period = found
    tz = ZoneInfo(job.timezone)
    return {"label": period.label, "timezone": job.timezone,
            "start": period.start.astimezone(tz).isoformat(),
            "end": period.end.astimezone(tz).isoformat(),
            "start_utc": period.start.astimezone(UTC).isoformat(),
            "end_utc": period.end.astimezone(UTC).isoformat()}


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def attempt_fields(attempt: Attempt) -> dict[str, Any]:
    """One Attempt: its number (the fence its claim took: 1, 2, ...), times, duration, outcome
    and model calls."""
    return {**attempt.model_dump(mode="json"), "number": attempt.fence,
            "duration_seconds": _seconds(attempt.started_at, attempt.finished_at)}


def output_location(run: Run, ui_url: str | None) -> dict[str, str | None]:
    """The Prefect flow run and (persist) task run that completed the Run, with links into the
    UI at ``ui_url`` when it is known."""
    flow_run, task_run = run.completed_flow_run_id, run.completed_task_run_id
    base = ui_url.rstrip("/") if ui_url else None
    return {"flow_run_id": flow_run, "task_run_id": task_run,
            "flow_run_url": f"{base}/runs/flow-run/{flow_run}" if base and flow_run else None,
            "task_run_url": f"{base}/runs/task-run/{task_run}" if base and task_run else None}


def run_fields(run: Run, attempts: list[Attempt], ui_url: str | None) -> dict[str, Any]:
    """The Run's operational record: its stored fields (times in UTC) without its documents,
    plus its key, period, attempt numbers, input version (the digest of its stored raw input),
    duration from its first claim to its completion, output location and final state."""
    first_claim = min((a.started_at for a in attempts if a.started_at is not None), default=None)
    return {
        **run.model_dump(mode="json", exclude={"raw_input", "output"}),
        "run_key": run.run_id,
        "period": period_label(run),
        "period_window": period_fields(run),
        "attempt_numbers": [a.fence for a in attempts],
        "input_version": (None if run.raw_input is None
                          else document_digest(run.raw_input, "raw input")),
        "first_claimed_at": first_claim.isoformat() if first_claim else None,
        "duration_seconds": _seconds(first_claim, run.completed_at),
        "output_location": output_location(run, ui_url),
        "final_state": run.status,
        # A tombstone has no documents or attempts left: say so rather than show nothing.
        "pruned": run.pruned_at is not None,
    }


def prefect_ui_url() -> str | None:
    """The Prefect UI's address, when known: PREFECT_UI_URL, else derived by Prefect from
    PREFECT_API_URL; None when neither is set (no links then)."""
    from prefect.settings import PREFECT_UI_URL

    value = PREFECT_UI_URL.value()
    return str(value) if value else None
