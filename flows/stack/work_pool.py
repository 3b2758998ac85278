"""The process work pool the deployments run on."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists
from prefect.workers.process import ProcessWorker

DEFAULT_POOL = "runledger"


def ensure_pool(client: SyncPrefectClient, name: str, queues: Sequence[str] = ()) -> None:
    """Create the process work pool ``name`` and its extra ``queues`` unless they exist."""
    with contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(
            name=name, type="process",
            base_job_template=ProcessWorker.get_default_base_job_template(),
        ))
    existing = {queue.name for queue in client.read_work_queues(work_pool_name=name)}
    for queue in queues:
        if queue not in existing:
            client.create_work_queue(name=queue, work_pool_name=name)
