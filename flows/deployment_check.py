"""Deployments checked against the jobs they run, before they are served or reported healthy:
the job exists and each cron schedule fires once per period at the job's due time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from deployments.project import DeploymentSpec, job_deployment
from flows.jobs.schedule import derived_cron, schedule_disagreement
from flows.registry import get_job, registered_jobs
from store import RunledgerError


def schedule_problems(specs: Iterable[DeploymentSpec], now: datetime) -> list[str]:
    """One line per run-job deployment whose job is unknown or whose schedule disagrees with
    its Job; empty when every one agrees."""
    problems: list[str] = []
    for spec in specs:
        if spec.job is None:
            continue
        try:
            job = get_job(spec.job)
        except RunledgerError as exc:
            problems.append(f"deployment {spec.name}: {exc}")
            continue
        for schedule in spec.schedules:
            if schedule.cron is None:
                problems.append(f"deployment {spec.name}: schedule {schedule.slug} is an "
                                f"interval; job {job.name} needs cron {derived_cron(job)!r} "
                                f"in {job.timezone}")
                continue
            why = schedule_disagreement(job, schedule.cron, schedule.timezone, now)
            if why:
                problems.append(f"deployment {spec.name}: {why}")
    return problems


def with_every_job(specs: Sequence[DeploymentSpec]) -> list[DeploymentSpec]:
    """``specs`` plus a deployment, on its derived schedule, for every registered job that no
    spec runs, less the run-job specs of jobs not registered here (the examples, in a team's
    install): what ``runledger serve`` serves without a prefect.yaml of the team's own."""
    jobs = registered_jobs()
    specs = [spec for spec in specs if spec.job is None or spec.job in jobs]
    covered = {spec.job for spec in specs}
    added = [job_deployment(job.name, derived_cron(job), job.timezone,
                            description=f"Job {job.name} (version {job.version}), "
                                        f"{job.cadence} in {job.timezone}.")
             for job in jobs.values() if job.name not in covered]
    return [*specs, *added]
