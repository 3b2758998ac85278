"""Retention that keeps deduplication: ``runledger prune`` and the ``prune`` flow turn the
completed Runs of registered jobs, completed longer ago than the retention, into tombstones
(``store.tombstones``), in bounded batches, after refusing a retention that some setting says
is too short. A tombstone keeps the Run a duplicate forever; its output is gone."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from flows.delivery.settings import DeliverySettings
from flows.jobs import Job
from flows.mail.channel import EmailDeliverySettings
from flows.mail.settings import ProviderSettings, load_settings
from flows.registry import get_job, registered_jobs
from store import MAX_BATCH, InvalidInput, Ledger, Prunable, Pruned, Storage

DEFAULT_OLDER_THAN = "90d"
DEFAULT_BATCH = 1000
ARTIFACT_KEY = "runledger-prune"
_UNITS = {"d": timedelta(days=1), "h": timedelta(hours=1), "m": timedelta(minutes=1)}
_DURATION = re.compile(r"(?:(\d+)([dhm]))+")
_PART = re.compile(r"(\d+)([dhm])")


class InvalidDuration(InvalidInput):
    """A retention must be written as whole days, hours and minutes, such as 90d, 36h or
    1d12h; nothing was written."""


class RetentionTooShort(InvalidInput):
    """The retention is shorter than a window that still needs the Runs it would prune;
    nothing was written."""


def parse_duration(text: str) -> timedelta:
    """A DURATION: one or more whole numbers each followed by d (days), h (hours) or m
    (minutes), largest unit first, e.g. ``90d``, ``36h``, ``1d12h``, ``90m``; positive."""
    given = text.strip().lower() if isinstance(text, str) else ""
    parts = _PART.findall(given)
    units = [unit for _, unit in parts]
    ordered = units == sorted(set(units), key="dhm".index)
    if not _DURATION.fullmatch(given) or not ordered:
        raise InvalidDuration(f"--older-than must be whole days, hours or minutes such as "
                              f"90d, 36h, 1d12h or 90m (each unit once, largest first); got "
                              f"{text!r}")
    value = sum((int(n) * _UNITS[unit] for n, unit in parts), timedelta(0))
    if value <= timedelta(0):
        raise InvalidDuration(f"--older-than must be longer than 0, got {text!r}")
    return value


def _days(value: timedelta) -> str:
    hours = value.total_seconds() / 3600
    return f"{hours / 24:g} days" if hours >= 24 else f"{hours:g} h"


def key_retention() -> tuple[timedelta, str] | None:
    """How long the configured delivery transport's receiver remembers an idempotency key, and
    the setting that says so; None for SMTP, which promises nothing."""
    if EmailDeliverySettings().transport != "provider":
        return None
    seconds = load_settings(ProviderSettings).key_retention_seconds
    return timedelta(seconds=seconds), "RUNLEDGER_PROVIDER_KEY_RETENTION_HOURS"


def check_retention(older_than: timedelta, jobs: Sequence[Job],
                    delivery: DeliverySettings | None = None,
                    keys: tuple[timedelta, str] | None = None) -> None:
    """Refuse a retention shorter than a window that still reads the Runs it would prune: a
    job's reconcile window (``catch_up_window``), the delivery retry window, the receiver's
    idempotency-key retention. The refusal names the setting."""
    delivery = delivery or DeliverySettings()
    for job in jobs:
        if older_than < job.catch_up_window:
            raise RetentionTooShort(
                f"--older-than {_days(older_than)} is shorter than job {job.name}'s reconcile "
                f"window ({_days(job.catch_up_window)}, its Job(catch_up_window=...)): reconcile "
                "reads those Runs; give a longer retention or shorten the window")
    window = timedelta(hours=delivery.max_window_hours)
    if older_than < window:
        raise RetentionTooShort(
            f"--older-than {_days(older_than)} is shorter than the delivery retry window "
            f"({_days(window)}, RUNLEDGER_DELIVERY_MAX_WINDOW_HOURS); give a longer retention")
    if keys is not None and older_than < keys[0]:
        raise RetentionTooShort(
            f"--older-than {_days(older_than)} is shorter than the email provider's "
            f"idempotency-key retention ({_days(keys[0])}, {keys[1]}); give a longer retention")


def selected_jobs(job: str | None) -> list[Job]:
    """The job named ``job`` (an unknown name is refused), or every registered job: Runs of a
    job not registered here are never pruned, since its reconcile window is unknown."""
    return [get_job(job)] if job is not None else list(registered_jobs().values())


@dataclass
class Counts:
    """What a pass made tombstones of and deleted (or, in a dry run, would), and the Runs from
    before the cutoff it left alone, by why."""

    runs: int = 0
    attempts: int = 0
    outbox: int = 0
    delivery_attempts: int = 0
    occurrences: int = 0
    document_bytes: int = 0
    batches: int = 0
    skipped_unfinished_outbox: int = 0
    skipped_failed: int = 0
    skipped_unfinished: int = 0
    tombstones: int = 0

    def add(self, done: Pruned | Prunable) -> None:
        for name in ("runs", "attempts", "outbox", "delivery_attempts", "occurrences",
                     "document_bytes"):
            setattr(self, name, getattr(self, name) + getattr(done, name))

    def left(self, found: Prunable) -> None:
        self.skipped_unfinished_outbox = found.unfinished_outbox
        self.skipped_failed = found.failed
        self.skipped_unfinished = found.unfinished
        self.tombstones = found.tombstones


COUNTED = [f.name for f in fields(Counts)]


@dataclass
class PruneReport:
    """What one pass did (or would do: ``dry_run``) to the Runs of ``jobs``, and the ledger's
    size before and after (PostgreSQL: after a plain VACUUM)."""

    older_than: timedelta
    cutoff: datetime
    dry_run: bool
    dialect: str
    jobs: list[str]
    before: Storage
    after: Storage | None = None
    counts: Counts = field(default_factory=Counts)

    def total(self, name: str) -> int:
        return int(getattr(self.counts, name))

    @property
    def reclaimed_bytes(self) -> int | None:
        """Bytes the database can reuse now: SQLite, the free pages the pass added to the file
        (reused before the file grows); PostgreSQL, the stored size of the nulled documents,
        reusable after the VACUUM (plus any table file shrink). None in a dry run."""
        if self.after is None:
            return None
        if self.dialect == "sqlite":
            return (self.after.free_bytes or 0) - (self.before.free_bytes or 0)
        return self.total("document_bytes") + max(0, self.before.total_bytes
                                                  - self.after.total_bytes)

    def rows(self) -> list[tuple[str, str]]:
        """The summary as (what, how many) lines, in the order people read them."""
        would = "would be " if self.dry_run else ""
        lines = [
            (f"Runs {would}pruned (tombstones made)", self.total("runs")),
            (f"attempt rows {would}deleted", self.total("attempts")),
            (f"outbox rows {would}deleted (sent, dead)", self.total("outbox")),
            (f"delivery-attempt rows {would}deleted", self.total("delivery_attempts")),
            (f"occurrence rows {would}deleted (settled alerts)", self.total("occurrences")),
            (f"document bytes {would}nulled", self.total("document_bytes")),
            ("skipped: completed, a message still to deliver",
             self.total("skipped_unfinished_outbox")),
            ("skipped: failed (awaiting an operator)", self.total("skipped_failed")),
            ("skipped: not finished (pending, running)", self.total("skipped_unfinished")),
            ("tombstones in the ledger", self.total("tombstones")),
        ]
        shown = [(what, f"{n:,}") for what, n in lines]
        shown.append(("ledger bytes before", f"{self.before.total_bytes:,}"))
        if self.after is not None:
            shown.append(("ledger bytes after" + (" (VACUUM)" if self.dialect == "postgresql"
                                                 else ""), f"{self.after.total_bytes:,}"))
            shown.append(("bytes reclaimed (reusable)", f"{self.reclaimed_bytes:,}"))
        return shown

    def as_dict(self) -> dict[str, Any]:
        return {
            "older_than_seconds": self.older_than.total_seconds(),
            "cutoff": self.cutoff.isoformat(), "dry_run": self.dry_run, "dialect": self.dialect,
            "jobs": self.jobs, "totals": {name: self.total(name) for name in COUNTED},
            "bytes_before": self.before.total_bytes,
            "free_bytes_before": self.before.free_bytes,
            "bytes_after": None if self.after is None else self.after.total_bytes,
            "free_bytes_after": None if self.after is None else self.after.free_bytes,
            "bytes_reclaimed": self.reclaimed_bytes,
        }

    def markdown(self) -> str:
        mode = " (dry run: nothing written)" if self.dry_run else ""
        lines = [f"# Prune{mode}", "",
                 f"Runs of {', '.join(f'`{j}`' for j in self.jobs)} completed before "
                 f"`{self.cutoff.isoformat()}` (older than {_days(self.older_than)}), "
                 f"{self.dialect} ledger.", "", "| | |", "|---|---|"]
        lines += [f"| {what} | {n} |" for what, n in self.rows()]
        return "\n".join(lines) + "\n"


Progress = Callable[[int, int], None]  # Runs pruned so far, Runs the pass found to prune


def prune_ledger(ledger: Ledger, older_than: timedelta, jobs: Sequence[Job], *,
                 dry_run: bool = False, batch_size: int = DEFAULT_BATCH,
                 now: datetime | None = None, progress: Progress | None = None) -> PruneReport:
    """One pass over the ledger: the Runs of ``jobs`` completed before ``now`` (default: the
    database clock) minus ``older_than`` become tombstones, ``batch_size`` Runs looked at per
    batch, each batch its own short transaction; a dry run counts the same selection and
    writes nothing. The caller checks the retention first (``check_retention``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
            or not 1 <= batch_size <= MAX_BATCH:
        raise InvalidInput(f"--batch-size must be from 1 to {MAX_BATCH} Runs, got {batch_size!r}")
    names = [job.name for job in jobs]
    cutoff = (now or ledger.now()) - older_than
    report = PruneReport(older_than, cutoff, dry_run, ledger.dialect, names, ledger.storage())
    if not names:
        return report
    done = report.counts
    found = ledger.retention.prunable(cutoff, names)
    if dry_run:
        done.add(found)
        done.left(found)
        return report
    cursor: str | None = ""
    while cursor is not None:
        batch = ledger.retention.prune_batch(cutoff, names, limit=batch_size, after=cursor)
        cursor = batch.cursor
        if cursor is not None:
            done.add(batch)
            done.batches += 1
            if progress is not None:
                progress(done.runs, found.runs)
    done.left(ledger.retention.prunable(cutoff, names))
    ledger.retention.vacuum()
    report.after = ledger.storage()
    return report


def checked_pass(ledger: Ledger, older_than: str, job: str | None, *, dry_run: bool = False,
                 batch_size: int = DEFAULT_BATCH, now: datetime | None = None,
                 progress: Progress | None = None) -> PruneReport:
    """Parse and check the retention against the selected jobs and the delivery settings
    (refused: nothing written), then prune (``prune_ledger``)."""
    retention = parse_duration(older_than)
    jobs = selected_jobs(job)
    check_retention(retention, jobs, keys=key_retention())
    return prune_ledger(ledger, retention, jobs, dry_run=dry_run, batch_size=batch_size,
                        now=now, progress=progress)


@flow(name="prune", log_prints=False)
async def prune(older_than: str = DEFAULT_OLDER_THAN, job: str | None = None,
                batch_size: int = DEFAULT_BATCH, dry_run: bool = False) -> dict[str, Any]:
    """Prune Runs completed longer ago than ``older_than``, keeping a tombstone of each, so
    that a rerun of their periods is still a Duplicate.

    Args:
        older_than: The retention: whole days, hours or minutes such as 90d, 36h or 1d12h. A
            retention shorter than a job's reconcile window, the delivery retry window or the
            provider's key retention is refused.
        job: Only this registered job; leave empty for every registered job.
        batch_size: Runs per transaction (1 to 10000).
        dry_run: Count what would be pruned and write nothing.
    """
    logger = get_run_logger()
    with Ledger.open_existing() as ledger:
        report = await asyncio.to_thread(checked_pass, ledger, older_than, job,
                                         dry_run=dry_run, batch_size=batch_size)
    await acreate_markdown_artifact(markdown=report.markdown(), key=ARTIFACT_KEY,
                                    description="What the prune pass made tombstones of")
    logger.info("prune: %s", "; ".join(f"{what} {n}" for what, n in report.rows()))
    return report.as_dict()
