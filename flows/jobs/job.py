"""The Job definition API: one file defines a scheduled AI job; the pipeline does the rest.

A Job names its cadence and timezone (what a Period is), its subjects (one Run per subject and
period) and four stage functions: ``collect`` gathers the raw input, ``transform`` asks the
model for a Candidate, ``validate`` accepts or rejects it, ``messages`` says whom to tell.
An optional ``effect`` writes business rows in the same transaction as the completion."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, get_args

from sqlalchemy import MetaData
from sqlmodel import Session

from flows.jobs.errors import InvalidJob, UnknownSubject
from store import OutboxMessage, Period, RunIdentity, validate_cadence, zone

if TYPE_CHECKING:
    from flows.model import Model

MissedRunPolicy = Literal["skip", "latest", "catch-up"]
DEFAULT_LEASE_SECONDS = 900.0
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Candidate:
    """What ``transform`` proposes; it becomes the Run's output once validated and persisted."""

    text: str
    model: str
    data: dict[str, Any] = field(default_factory=dict)

    def output(self) -> dict[str, Any]:
        """The output document stored on the Run: ``data`` plus ``text`` and ``model``."""
        return {**self.data, "text": self.text, "model": self.model}


Collect = Callable[[str, Period], dict[str, Any]]
Transform = Callable[[dict[str, Any], "Model"], Candidate]
Validate = Callable[[Candidate], None]
Messages = Callable[[str, Period, dict[str, Any]], Sequence[OutboxMessage]]
Effect = Callable[[Session, dict[str, Any]], None]
Params = Callable[[str, Period], dict[str, Any]]
Subjects = Sequence[str] | Callable[[], Iterable[str]]


@dataclass(frozen=True, kw_only=True)
class Job:
    """A named, versioned scheduled job.

    Attributes:
        name: lowercase letters, digits and dashes, e.g. ``competitor-summary``.
        version: part of every Run's identity: bump it only when a new result is wanted.
        cadence: ``hourly``, ``daily``, ``weekly``, ``monthly`` or a 5-field cron expression.
        timezone: the IANA zone the cadence is counted in (``Europe/Paris``).
        subjects: the subjects of a tick, or a function listing them when the tick starts.
        collect: ``collect(subject, period) -> dict``, the raw input (stored once per Run).
        transform: ``transform(raw, model) -> Candidate``.
        validate: ``validate(candidate)`` raises ``ValidationFailed`` to reject it.
        messages: ``messages(subject, period, output) -> [OutboxMessage]``, queued on completion.
        effect: ``effect(session, output)``, business rows committed with the completion.
        params: ``params(subject, period) -> dict``, what shapes the Run besides its identity
            (e.g. the recipients); the same Run with other params is a conflict.
        tables: metadata of the business tables ``effect`` writes (``runledger db upgrade``
            creates them).
        missed_runs: what a scheduler should do about periods that never ran: ``skip`` them,
            run only the ``latest``, or ``catch-up`` every one (see ``missed_periods``).
        lease_seconds: how long a claim lasts without renewal (RUNLEDGER_LEASE_SECONDS wins).
    """

    name: str
    version: str
    cadence: str
    timezone: str
    subjects: Subjects
    collect: Collect
    transform: Transform
    validate: Validate
    messages: Messages
    effect: Effect | None = None
    params: Params | None = None
    tables: MetaData | None = None
    missed_runs: MissedRunPolicy = "skip"
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name) or len(self.name) > 100:
            raise InvalidJob(
                f"job name must be lowercase letters, digits and single dashes (at most 100), "
                f"got {self.name!r}"
            )
        if not isinstance(self.version, str) or not self.version.strip():
            raise InvalidJob(f"job {self.name}: version must be a non-empty string")
        validate_cadence(self.cadence)
        zone(self.timezone)
        if self.missed_runs not in get_args(MissedRunPolicy):
            raise InvalidJob(f"job {self.name}: missed_runs must be one of "
                             f"{', '.join(get_args(MissedRunPolicy))}, got {self.missed_runs!r}")
        if not self.lease_seconds > 0:
            raise InvalidJob(f"job {self.name}: lease_seconds must be positive")
        for stage in ("collect", "transform", "validate", "messages"):
            if not callable(getattr(self, stage)):
                raise InvalidJob(f"job {self.name}: {stage} must be a function")

    def period_at(self, nominal: datetime) -> Period:
        """The period of this job that contains the nominal instant."""
        return Period.containing(nominal, self.cadence, self.timezone)

    def parse_period(self, text: str) -> Period:
        """The period named by a date (YYYY-MM-DD, in the job's timezone) or an ISO datetime
        with an offset."""
        return Period.parse(text, self.cadence, self.timezone)

    def subject_names(self) -> list[str]:
        """Every subject of a tick, in order, without repeats."""
        listed = self.subjects() if callable(self.subjects) else self.subjects
        return list(dict.fromkeys(listed))

    def resolve_subjects(self, requested: Sequence[str] | None) -> list[str]:
        """The requested subjects (all when none are given); an unknown one is an error."""
        known = self.subject_names()
        if not requested:
            return known
        if isinstance(requested, str) or not isinstance(requested, list | tuple):
            raise UnknownSubject(f"job {self.name}: subjects must be a list of subject names, "
                                 f"got {type(requested).__name__}; known subjects: "
                                 f"{', '.join(known) or '(none)'}")
        bad = [s for s in requested if not isinstance(s, str)]
        if bad:
            raise UnknownSubject(f"job {self.name}: a subject must be a string, got "
                                 f"{', '.join(sorted({type(s).__name__ for s in bad}))}; known "
                                 f"subjects: {', '.join(known) or '(none)'}")
        wanted = list(dict.fromkeys(s.strip() for s in requested))
        unknown = sorted(set(wanted) - set(known), key=wanted.index)
        if unknown:
            raise UnknownSubject(
                f"job {self.name} has no subject {', '.join(map(repr, unknown))}; "
                f"known subjects: {', '.join(known) or '(none)'}"
            )
        return wanted

    def identity(self, subject: str, period: Period) -> RunIdentity:
        return RunIdentity(self.name, subject, period.start, self.version)

    def run_params(self, subject: str, period: Period) -> dict[str, Any]:
        return self.params(subject, period) if self.params is not None else {}

    def missed_periods(self, last_run: Period, now: datetime) -> list[Period]:
        """The periods after ``last_run`` that ended before ``now``, as ``missed_runs`` wants."""
        if self.missed_runs == "skip":
            return []
        missed: list[Period] = []
        current = self.period_at(last_run.end)
        while current.end <= now:
            missed.append(current)
            current = self.period_at(current.end)
        return missed[-1:] if self.missed_runs == "latest" else missed
