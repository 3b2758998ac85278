"""Everything the host drills take from runledger's own modules beyond its public entry points
(the ``runledger`` CLI, deployments/prefect.yaml, ``store.Ledger``, ``store.faults``): one
place to fix when they move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from deployments.project import PREFECT_FILE, PROJECT_ROOT
from flows.mail.letter import message_id_for
from flows.registry import ENTRY_POINT_GROUP
from flows.stack import commands
from flows.stack.automations import install_crash_detector
from flows.stack.prefect_server import api_url, client, server_env, wait_until_healthy
from flows.stack.processes import Child, Supervisor
from flows.stack.work_pool import ensure_pool

__all__ = [
    "ENTRY_POINT_GROUP", "PROJECT_ROOT", "Child", "Supervisor", "api_url", "client",
    "commands", "deployment", "ensure_pool", "install_crash_detector", "message_id_for", "server_env",
    "wait_until_healthy",
]


def deployment(name: str) -> dict[str, Any]:
    """The deployment ``name`` of deployments/prefect.yaml (its entrypoint is where the flow
    lives today), with the file's build and pull steps."""
    spec = yaml.safe_load(Path(PREFECT_FILE).read_text())
    found = next(d for d in spec["deployments"] if d["name"] == name)
    return {"build": spec.get("build"), "pull": spec.get("pull"), **found}
