"""Fixtures the integration tests of the pipeline share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.pipeline_support import Env, pipeline_env


@pytest.fixture
def env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_api: str) -> Iterator[Env]:
    """A fresh ledger with the jobs' tables, a copy of the sample data, a model call log and
    fast retries; flows in this process use the session's Prefect server."""
    with pipeline_env(db_url, tmp_path, monkeypatch) as found:
        yield found


@pytest.fixture
def subprocesses_use_the_session_server(monkeypatch: pytest.MonkeyPatch, prefect_api: str) -> None:
    """Worker and CLI subprocesses started by the test talk to the session's Prefect server."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
