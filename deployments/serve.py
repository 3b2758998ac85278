"""`runledger serve`: deployments with their schedules served by one process (Prefect's
``serve``), for one machine without a work pool.

On shutdown Prefect's serve pauses these deployments and drops their future scheduled runs, and
Prefect's scheduler never creates runs for slots that passed while nothing was serving."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.flows import load_flow_from_entrypoint

from deployments.project import DeploymentSpec


def runner_deployment(spec: DeploymentSpec) -> RunnerDeployment:
    """The served form of ``spec``: same flow, name, parameters, tags and schedules. A module
    entrypoint loads wherever runledger is installed; a file path is read from the current
    folder, as ``prefect deploy`` reads it."""
    return RunnerDeployment.from_flow(
        load_flow_from_entrypoint(spec.entrypoint),
        name=spec.name,
        parameters=spec.parameters,
        tags=spec.tags,
        description=spec.description,
        schedules=[schedule.to_prefect() for schedule in spec.schedules],
    )


def serve_all(specs: Sequence[DeploymentSpec], limit: int | None = None) -> None:
    """Serve ``specs`` until SIGINT or SIGTERM."""
    serve(*(runner_deployment(spec) for spec in specs), limit=limit)
