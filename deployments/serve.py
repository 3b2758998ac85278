"""`runledger serve`: every deployment of prefect.yaml, with its schedules, served by one process
(Prefect's ``serve``), for one machine without a work pool.

On shutdown Prefect's serve pauses these deployments and drops their future scheduled runs, and
Prefect's scheduler never creates runs for slots that passed while nothing was serving."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.flows import load_flow_from_entrypoint

from deployments.project import PREFECT_FILE, PROJECT_ROOT, DeploymentSpec, load_deployments


def runner_deployment(spec: DeploymentSpec) -> RunnerDeployment:
    """The served form of ``spec``: same flow, name, parameters, tags and schedules."""
    return RunnerDeployment.from_flow(
        load_flow_from_entrypoint(spec.entrypoint),
        name=spec.name,
        parameters=spec.parameters,
        tags=spec.tags,
        description=spec.description,
        schedules=[schedule.to_prefect() for schedule in spec.schedules],
    )


def serve_all(specs: Sequence[DeploymentSpec] | None = None, limit: int | None = None,
              path: Path = PREFECT_FILE) -> None:
    """Serve ``specs`` (default: every deployment of the file at ``path``) until SIGINT or
    SIGTERM."""
    chosen = load_deployments(path) if specs is None else list(specs)
    # Entrypoints are paths from the project root, and served flow runs start in this
    # process's working directory.
    os.chdir(PROJECT_ROOT)
    serve(*(runner_deployment(spec) for spec in chosen), limit=limit)
