"""The deployments of ``deployments/prefect.yaml`` as typed specs.

``prefect deploy`` reads the same file; ``runledger serve`` and the local stack read it through
this module, so schedules, parameters and tags are written once."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from prefect.schedules import Cron, Interval, Schedule

from store import InvalidInput

PREFECT_FILE = Path(__file__).with_name("prefect.yaml")
PROJECT_ROOT = PREFECT_FILE.resolve().parents[1]
# The module that names every deployable flow; a deployment's entrypoint is MODULE.<flow>.
ENTRYPOINT_MODULE = "flows.entrypoints"
RUN_JOB = f"{ENTRYPOINT_MODULE}.run_job"


class InvalidDeployment(InvalidInput):
    """A deployment in prefect.yaml is invalid."""


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule: a cron expression with its timezone, or an interval in seconds."""

    slug: str
    cron: str | None = None
    interval: float | None = None
    timezone: str | None = None
    anchor_date: datetime | None = None
    active: bool = True
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_prefect(self) -> Schedule:
        if self.cron is not None:
            return Cron(self.cron, timezone=self.timezone, active=self.active,
                        parameters=self.parameters, slug=self.slug)
        assert self.interval is not None
        return Interval(self.interval, anchor_date=self.anchor_date, timezone=self.timezone,
                        active=self.active, parameters=self.parameters, slug=self.slug)


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: which flow (``package.module.flow``, or ``path.py:flow`` from the folder
    it is deployed from, as ``prefect deploy`` reads it), with what."""

    name: str
    entrypoint: str
    parameters: dict[str, Any]
    tags: list[str]
    description: str
    work_pool: str
    work_queue: str
    schedules: list[ScheduleSpec]

    @property
    def job(self) -> str | None:
        """The job a run-job deployment runs (its ``job`` parameter), else None."""
        is_run_job = self.entrypoint.replace(":", ".").rsplit(".", 1)[-1] == "run_job"
        job = self.parameters.get("job")
        return job if is_run_job and isinstance(job, str) else None


def _schedule(deployment: str, raw: dict[str, Any]) -> ScheduleSpec:
    where = f"deployment {deployment!r}: schedule {raw!r}"
    slug = raw.get("slug")
    if not isinstance(slug, str) or not slug:
        raise InvalidDeployment(f"{where} needs a slug (its id must survive redeploys)")
    if ("cron" in raw) == ("interval" in raw):
        raise InvalidDeployment(f"{where} must have exactly one of cron or interval")
    if not raw.get("timezone"):
        raise InvalidDeployment(f"{where} needs a timezone")
    anchor = raw.get("anchor_date")
    if "interval" in raw and anchor is None:
        raise InvalidDeployment(f"{where} needs an anchor_date (else each deploy moves its slots)")
    return ScheduleSpec(
        slug=slug,
        cron=raw.get("cron"),
        interval=float(raw["interval"]) if "interval" in raw else None,
        timezone=raw["timezone"],
        anchor_date=datetime.fromisoformat(str(anchor)) if anchor is not None else None,
        active=bool(raw.get("active", True)),
        parameters=dict(raw.get("parameters") or {}),
    )


def _deployment(raw: dict[str, Any]) -> DeploymentSpec:
    name = raw.get("name")
    entrypoint = raw.get("entrypoint")
    if not isinstance(name, str) or not isinstance(entrypoint, str) or not (
            ":" in entrypoint or "." in entrypoint):
        raise InvalidDeployment(f"a deployment needs a name and an entrypoint ({RUN_JOB} or "
                                f"path.py:flow), got {raw.get('name')!r} / "
                                f"{raw.get('entrypoint')!r}")
    pool = raw.get("work_pool") or {}
    if not pool.get("name"):
        raise InvalidDeployment(f"deployment {name!r} needs a work_pool name")
    return DeploymentSpec(
        name=name,
        entrypoint=entrypoint,
        parameters=dict(raw.get("parameters") or {}),
        tags=list(raw.get("tags") or []),
        description=str(raw.get("description") or ""),
        work_pool=pool["name"],
        work_queue=pool.get("work_queue_name") or "default",
        schedules=[_schedule(name, s) for s in raw.get("schedules") or []],
    )


def load_deployments(path: Path = PREFECT_FILE) -> list[DeploymentSpec]:
    """Every deployment of ``path``, checked: names unique, every schedule with a slug."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    specs = [_deployment(raw) for raw in document.get("deployments") or []]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise InvalidDeployment(f"deployment names repeat in {path}: {names}")
    return specs


def job_deployment(job: str, cron: str, timezone: str, description: str,
                   pool: str = "runledger") -> DeploymentSpec:
    """The run-job deployment of ``job`` on ``cron`` in ``timezone``, named after the job, as
    ``runledger init`` writes it into a team's prefect.yaml."""
    return DeploymentSpec(
        name=job, entrypoint=RUN_JOB, parameters={"job": job},
        tags=["runledger", f"job:{job}"], description=description, work_pool=pool,
        work_queue="default",
        schedules=[ScheduleSpec(slug=f"{job}-schedule", cron=cron, timezone=timezone)])


def deployment(name: str, path: Path = PREFECT_FILE) -> DeploymentSpec:
    """The deployment called ``name``."""
    for spec in load_deployments(path):
        if spec.name == name:
            return spec
    raise InvalidDeployment(f"no deployment named {name!r} in {path}")
