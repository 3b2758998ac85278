"""The registry of jobs, what operators and the flows call (a job author needs none of it):
jobs by name, and the ledger upgrade that creates every registered job's tables. A job is found
if a module of the ``flows.jobs`` package defines it (the examples, see
``examples_registered``), or if an installed package publishes it under the entry-point group
``runledger.jobs`` (``my-job = "my_package.jobs:job"``; the value is a Job or a module defining
Jobs)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import threading
from collections.abc import Iterable
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from types import ModuleType

from flows.errors import InvalidJob, UnknownJob
from flows.jobs.job import Job
from flows.settings import RunledgerSettings
from store import Ledger

ENTRY_POINT_GROUP = "runledger.jobs"
PACKAGE = "flows.jobs"

_jobs: dict[str, Job] = {}
_discovered = False
_lock = threading.RLock()


def register(job: Job) -> Job:
    """Add ``job`` to the registry; another job under the same name is an error."""
    if not isinstance(job, Job):
        raise InvalidJob(f"only Job objects can be registered, got {type(job).__name__}")
    with _lock:
        existing = _jobs.get(job.name)
        if existing is not None and existing is not job:
            raise InvalidJob(f"two different jobs are named {job.name!r}")
        _jobs[job.name] = job
    return job


def jobs_in_module(module: ModuleType) -> list[Job]:
    """The Job objects a module defines at its top level."""
    return [value for value in vars(module).values() if isinstance(value, Job)]


def jobs_from_entry_points(found: Iterable[EntryPoint]) -> list[Job]:
    """The jobs published by entry points; one that cannot load is a clear error."""
    jobs: list[Job] = []
    for entry in found:
        try:
            value = entry.load()
        except Exception as exc:
            raise InvalidJob(
                f"entry point {entry.name} = {entry.value!r} of group {ENTRY_POINT_GROUP} "
                f"failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(value, ModuleType):
            jobs.extend(jobs_in_module(value))
        elif isinstance(value, Job):
            jobs.append(value)
        else:
            raise InvalidJob(
                f"entry point {entry.name} = {entry.value!r} of group {ENTRY_POINT_GROUP} "
                f"is a {type(value).__name__}, not a Job or a module"
            )
    return jobs


def shipped_jobs() -> list[Job]:
    """The jobs defined by the modules of the ``flows.jobs`` package itself."""
    package = importlib.import_module(PACKAGE)
    return [
        job
        for info in pkgutil.iter_modules(package.__path__, prefix=f"{PACKAGE}.")
        if not info.name.rsplit(".", 1)[-1].startswith("_")
        for job in jobs_in_module(importlib.import_module(info.name))
    ]


def examples_registered() -> bool:
    """Whether the shipped example jobs are registered: RUNLEDGER_EXAMPLE_JOBS if set, else
    only in a checkout of runledger (an editable install), never in a team's install of the
    wheel, where they would be scheduled and reconciled beside the team's own jobs."""
    chosen = RunledgerSettings().example_jobs
    if chosen is not None:
        return chosen
    try:
        origin = json.loads(distribution("runledger").read_text("direct_url.json") or "{}")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return True
    return bool(origin.get("dir_info", {}).get("editable"))


def _discover() -> None:
    global _discovered
    with _lock:
        if _discovered:
            return
        for job in shipped_jobs() if examples_registered() else []:
            register(job)
        for job in jobs_from_entry_points(entry_points(group=ENTRY_POINT_GROUP)):
            register(job)
        _discovered = True


def registered_jobs() -> dict[str, Job]:
    """Every known job by name, sorted."""
    _discover()
    with _lock:
        return dict(sorted(_jobs.items()))


def get_job(name: str) -> Job:
    """The job called ``name``; an unknown name is an error listing the known ones."""
    jobs = registered_jobs()
    try:
        return jobs[name]
    except (KeyError, TypeError):
        raise UnknownJob(
            f"unknown job {name!r}; registered jobs: {', '.join(jobs) or '(none)'}"
        ) from None


def upgrade_ledger(ledger: Ledger, revision: str = "head") -> list[str]:
    """Bring the ledger schema to ``revision`` and create the missing business tables of every
    registered job (the step a deployment runs before its workers, as ``runledger db
    upgrade``); returns the names of the jobs that have tables."""
    ledger.migrate(revision)
    with_tables = {name: job.tables for name, job in registered_jobs().items()
                   if job.tables is not None}
    for tables in with_tables.values():
        ledger.create_tables(tables)
    return list(with_tables)
