"""The Job definition API: one file defines a scheduled AI job; the pipeline does the rest.

A Job names its cadence and timezone (what a Period is), its subjects (one Run per subject and
period) and four stage functions: ``collect`` gathers the raw input, ``transform`` asks the
model for a Candidate, ``validate`` accepts or rejects it, ``messages`` says whom to tell.
An optional ``effect`` writes business rows in the same transaction as the completion."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args
from zoneinfo import ZoneInfo

from sqlalchemy import MetaData

from flows.errors import InvalidJob, UnknownSubject
from flows.jobs.approval import Approval
from flows.jobs.budget import Budget
from flows.model import Model
from flows.targets import Target
from store import Effect, OutboxMessage, Period, RunIdentity

MissedRunPolicy = Literal["skip", "latest", "catch-up"]
DEFAULT_LEASE_SECONDS = 900.0
DEFAULT_GRACE = timedelta(hours=1)
DEFAULT_CATCH_UP_WINDOW = timedelta(days=7)
DEFAULT_MAX_ATTEMPTS = 5
MAX_ENDPOINT_NAME = 300
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
Params = Callable[[str, Period], dict[str, Any]]
Subjects = Sequence[str] | Callable[[], Iterable[str]]
Targets = Sequence[Target] | Callable[[], Iterable[Target]]
Approvals = Approval | Callable[[], Approval | None] | None


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
        targets: where those messages go (``Target.email()``, ``Target.webhook("block")``,
            ``Target.object("block")``), or a function listing them when a tick starts; default:
            email only. A tick checks their blocks before its first model call, and
            ``runledger check`` that the delivery deployment delivers their channels.
        effect: ``effect(session, output)``, business rows committed with the completion.
        params: ``params(subject, period) -> dict``, what shapes the Run besides its identity
            (e.g. the recipients); the same Run with other params is a conflict.
        tables: metadata of the business tables ``effect`` writes (``runledger db upgrade``
            creates them).
        missed_runs: what reconcile does about an owed occurrence nobody started by its due
            time plus ``max_lateness``, and what a scheduled flow run that starts that late does:
            ``skip`` it (recorded as skipped), run only the ``latest`` owed period (older ones
            are skipped as superseded), or ``catch-up`` every one, oldest first.
        start: the first period the job owes (an aware datetime inside it); default: the
            period in which reconcile first sees the job. A subject added later is owed from
            the period in which reconcile first sees it.
        due: when in its period an occurrence is due, from the period's start: the time of the
            deployment's scheduled slot (a test checks that they agree).
        grace: how long after its due time an unfinished occurrence is reported overdue.
        max_lateness: how late after its due time an occurrence may still start on its own
            schedule before the missed-run policy decides (default: ``grace``).
        catch_up_window: how far back reconcile looks for owed occurrences.
        max_attempts: claims a Run may take before reconcile gives up on it (``failed``).
        lease_seconds: how long a claim lasts without renewal (RUNLEDGER_LEASE_SECONDS wins).
        budget: what the job may spend on its model per period and per UTC day
            (``Budget(per_period="2.50")``); a subject the budget refuses ends over-budget,
            with no model call, and is owed until the window resets or the cap is raised.
        endpoint: the name of the model endpoint ``transform`` calls (default: ``default``,
            the RUNLEDGER_MODEL* settings); jobs naming the same endpoint share its limits.
        shard_size: a tick run from a deployment with more subjects to run than this is split
            into shards of at most this many, each a flow run of the same deployment that any
            worker of its work pool takes (the run-job ``shard_size`` parameter wins); default
            None: a tick runs in one flow run.
        approval: ``Approval()`` holds the job's messages until a person approves them (the
            CLI's ``outbox approve``, or the review-outbox flow run's form in the Prefect UI);
            or a function deciding it when a tick starts; default None: sent without review.
        batch: send the transform's model calls through the provider's Batch API (half the
            price; results within 24 hours, most within one): a tick queues each call, its
            Runs wait without a worker, and ``runledger batches poll`` (the settle-batches
            deployment) settles the batch and finishes them (the run-job ``batch`` parameter
            wins); default False: each call answered at once.
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
    targets: Targets = (Target.email(),)
    effect: Effect | None = None
    params: Params | None = None
    tables: MetaData | None = None
    missed_runs: MissedRunPolicy = "skip"
    start: datetime | None = None
    due: timedelta = timedelta(0)
    grace: timedelta = DEFAULT_GRACE
    max_lateness: timedelta | None = None
    catch_up_window: timedelta = DEFAULT_CATCH_UP_WINDOW
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    budget: Budget | None = None
    endpoint: str = "default"
    shard_size: int | None = None
    approval: Approvals = None
    batch: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name) or len(self.name) > 100:
            raise InvalidJob(
                f"job name must be lowercase letters, digits and single dashes (at most 100), "
                f"got {self.name!r}"
            )
        if not isinstance(self.version, str) or not self.version.strip():
            raise InvalidJob(f"job {self.name}: version must be a non-empty string")
        Period.check_cadence(self.cadence, self.timezone)
        if self.missed_runs not in get_args(MissedRunPolicy):
            raise InvalidJob(f"job {self.name}: missed_runs must be one of "
                             f"{', '.join(get_args(MissedRunPolicy))}, got {self.missed_runs!r}")
        if not self.lease_seconds > 0:
            raise InvalidJob(f"job {self.name}: lease_seconds must be positive")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise InvalidJob(f"job {self.name}: budget must be a Budget, such as "
                             f"Budget(per_period=\"2.50\"), got {self.budget!r}")
        if not isinstance(self.endpoint, str) or not self.endpoint.strip() \
                or len(self.endpoint) > MAX_ENDPOINT_NAME:
            raise InvalidJob(f"job {self.name}: endpoint must name a model endpoint (at most "
                             f"{MAX_ENDPOINT_NAME} characters), such as \"default\", got "
                             f"{self.endpoint!r}")
        if self.shard_size is not None and (isinstance(self.shard_size, bool)
                                            or not isinstance(self.shard_size, int)
                                            or self.shard_size < 1):
            raise InvalidJob(f"job {self.name}: shard_size must be a whole number of subjects, "
                             f"1 or more (or None: never shard), got {self.shard_size!r}")
        if not isinstance(self.batch, bool):
            raise InvalidJob(f"job {self.name}: batch must be True or False, got {self.batch!r}")
        if self.start is not None and (not isinstance(self.start, datetime)
                                       or self.start.tzinfo is None):
            raise InvalidJob(f"job {self.name}: start must be a timezone-aware datetime, "
                             f"got {self.start!r}")
        for name in ("due", "grace", "max_lateness", "catch_up_window"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, timedelta) or value < timedelta(0)):
                raise InvalidJob(f"job {self.name}: {name} must be a timedelta of 0 or more, "
                                 f"got {value!r}")
        if not self.catch_up_window > timedelta(0):
            raise InvalidJob(f"job {self.name}: catch_up_window must be positive")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or self.max_attempts < 1:
            raise InvalidJob(f"job {self.name}: max_attempts must be a positive integer, "
                             f"got {self.max_attempts!r}")
        if not callable(self.targets):
            self.target_list()
        if not callable(self.approval):
            self.approval_now()
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

    def target_list(self) -> list[Target]:
        """Where this job's messages go, in order, without repeats."""
        listed = list(self.targets() if callable(self.targets) else self.targets)
        if isinstance(self.targets, str) or not all(isinstance(t, Target) for t in listed):
            raise InvalidJob(f"job {self.name}: targets must be Targets, such as "
                             f"[Target.email(), Target.webhook(\"reports-api\")], got "
                             f"{self.targets!r}")
        return list(dict.fromkeys(listed))

    def approval_now(self) -> Approval | None:
        """Whether and how this job's messages wait for a person, as of now."""
        found = self.approval() if callable(self.approval) else self.approval
        if found is not None and not isinstance(found, Approval):
            raise InvalidJob(f"job {self.name}: approval must be an Approval, such as "
                             f"Approval(channels=(\"email\",)), or None, got {found!r}")
        return found

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

    @property
    def lateness_allowed(self) -> timedelta:
        """How late an occurrence may start on its own schedule (``max_lateness`` or ``grace``)."""
        return self.grace if self.max_lateness is None else self.max_lateness

    def due_at(self, period: Period) -> datetime:
        """When the occurrence of ``period`` is due: its scheduled slot, ``due`` after the
        period's start on the wall clock of the job's timezone (07:00 stays 07:00 across DST)."""
        local = period.start.astimezone(ZoneInfo(self.timezone))
        return (local + self.due).astimezone(UTC)

    def latest_due_period(self, now: datetime) -> Period:
        """The most recent period whose occurrence is due at ``now``."""
        period = self.period_at(now)
        while self.due_at(period) > now:
            period = self.period_at(period.start - timedelta(microseconds=1))
        return period
