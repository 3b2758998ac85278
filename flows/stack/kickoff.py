"""The stack's first runs: its deployments found on the Prefect server by name, and one flow
run of a deployment created and waited for (the UI's "Run"), as ``stack up`` kicks off the
reference job and a delivery pass."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
from prefect.client.schemas.objects import FlowRun

from flows.stack.auth import NO_AUTH, StackAuth
from flows.stack.prefect_server import client
from flows.stack.processes import StackError

REFERENCE_DEPLOYMENT = "competitor-summary"
DELIVERY_DEPLOYMENT = "deliver-outbox"


def deployment_ids(api: SyncPrefectClient, names: list[str]) -> dict[str, UUID]:
    found = api.read_deployments(
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=names)))
    return {d.name: d.id for d in found}


def wait_for_deployments(url: str, names: list[str], timeout: float,
                         auth: StackAuth = NO_AUTH) -> dict[str, UUID]:
    deadline = time.monotonic() + timeout
    with client(url, auth.value) as api:
        while True:
            ids = deployment_ids(api, names)
            if len(ids) == len(names):
                return ids
            if time.monotonic() > deadline:
                missing = sorted(set(names) - set(ids))
                raise StackError(f"deployments {', '.join(missing)} did not appear on the "
                                 f"Prefect server within {timeout:.0f} s")
            time.sleep(1.0)


def run_and_wait(url: str, deployment_id: UUID, timeout: float,
                 parameters: dict[str, Any] | None = None,
                 auth: StackAuth = NO_AUTH) -> FlowRun:
    """Create a flow run of the deployment (the UI's "Run") and wait until it is final."""
    with client(url, auth.value) as api:
        run = api.create_flow_run_from_deployment(deployment_id, parameters=parameters or {})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = api.read_flow_run(run.id)
            if run.state is not None and run.state.is_final():
                return run
            time.sleep(1.0)
    raise StackError(f"flow run {run.name} ({run.id}) did not finish within {timeout:.0f} s")
