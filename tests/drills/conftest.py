"""The drills' shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.drills.prefect_server import Server, prefect_server


@pytest.fixture(scope="session")
def drill_server(postgres_databases: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The drills' Prefect server (tests/drills/prefect_server.py), one per pytest process:
    the drills using it tell their Runs apart by job, flow run and time."""
    with prefect_server(postgres_databases, tmp_path_factory.mktemp("drill-server")) as server:
        yield server
