"""Fixtures the integration tests of the pipeline share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.pipeline_support import Env, ModelServer, pipeline_env


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


@pytest.fixture
def model_server(env: Env) -> Iterator[ModelServer]:
    """An OpenAI-compatible server on loopback, selected through RUNLEDGER_MODEL=openai (for
    this process and the workers it starts)."""
    with ModelServer() as server:
        env.set(model="openai", model_base_url=server.base_url, model_name="probe-model",
                model_api_key="sk-test")
        yield server
