"""The drills' shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.prefect_server import Server, prefect_server


# Per module: a server left running for the rest of a pytest-xdist worker's session would
# spend its CPU on its background services under every later test.
@pytest.fixture(scope="module")
def drill_server(postgres_databases: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Prefect server of the drill module's own (tests/support/prefect_server.py)."""
    with prefect_server(postgres_databases, tmp_path_factory.mktemp("drill-server")) as server:
        yield server
