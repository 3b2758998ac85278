"""Fixtures the integration tests share: the pipeline's environment and the command line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from bench.anthropic_batch_provider import AnthropicBatchServer
from bench.batch_provider import BatchServer
from flows.cli import app
from tests.support.pipeline import Env, ModelServer, pipeline_env


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A CLI runner whose ledger is the test database ($RUNLEDGER_DATABASE_URL)."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", db_url)
    return CliRunner()


@pytest.fixture
def invoke(cli: CliRunner) -> Callable[..., Result]:
    """`runledger ARGS` through ``cli``, its result returned (stdout and stderr apart) and any
    exception raised (a traceback is a failure, never an outcome). Keywords go to
    ``CliRunner.invoke`` (``env={"COLUMNS": "80"}``)."""
    def run(*args: str, **options: Any) -> Result:
        return cli.invoke(app, list(args), catch_exceptions=False, **options)
    return run


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
def server() -> Iterator[ModelServer]:
    """An OpenAI-compatible server on loopback that no setting selects: the test builds the
    client it asks (``model_server`` selects one through the settings)."""
    with ModelServer() as running:
        yield running


@pytest.fixture
def batch_server() -> Iterator[BatchServer]:
    """OpenAI's Files and Batches API on loopback (batches end when created unless the test
    sets ``polls_until_done``); the test builds the batch client it asks."""
    with BatchServer() as running:
        yield running


@pytest.fixture
def anthropic_server() -> Iterator[AnthropicBatchServer]:
    """Anthropic's Message Batches API on loopback (batches end when created unless the test
    sets ``polls_until_done``)."""
    with AnthropicBatchServer() as running:
        yield running


@pytest.fixture
def model_server(env: Env) -> Iterator[ModelServer]:
    """An OpenAI-compatible server on loopback, selected through RUNLEDGER_MODEL=openai (for
    this process and the workers it starts)."""
    with ModelServer() as server:
        env.set(model="openai", model_base_url=server.base_url, model_name="probe-model",
                model_api_key="sk-test")
        yield server
