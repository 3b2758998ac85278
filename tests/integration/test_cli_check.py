"""`runledger check` on a healthy setup and on broken ones, on both ledgers: one line per
finding, exit status 1 when anything failed, the fix named in the line."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings
from typer.testing import CliRunner

from bench.loopback import Answer, LoopbackServer, Request
from flows.cli import app
from flows.mail.sink import Sink

RUNNER = CliRunner()


@pytest.fixture
def healthy(db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A migrated ledger, an SMTP server that greets, the offline model, no Prefect server
    (neither in the environment nor in the settings the session's test server set)."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("RUNLEDGER_MODEL", "offline")
    monkeypatch.setenv("RUNLEDGER_SMTP_TLS", "none")
    monkeypatch.setenv("RUNLEDGER_MAIL_FROM", "runledger@example.org")
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        yield tmp_path


def check(folder: Path) -> tuple[int, list[str]]:
    result = RUNNER.invoke(app, ["check", "--folder", str(folder)])
    return result.exit_code, result.output.splitlines()


def line(lines: list[str], topic: str) -> str:
    [found] = [x for x in lines if x.split()[1:2] == [topic]]
    return " ".join(found.split())


def test_a_healthy_setup_passes_every_check_it_can_make(
        healthy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ledger migrated, both shipped jobs with their package, mail greeting, offline model;
    the server's deployments are skipped without PREFECT_API_URL; exit 0."""
    with Sink() as sink:
        monkeypatch.setenv("RUNLEDGER_SMTP_PORT", str(sink.port))
        status, lines = check(healthy)
    assert status == 0, lines
    assert line(lines, "ledger").startswith("ok ledger")
    jobs = [x for x in lines if x.split()[1:2] == ["job"]]
    assert any("competitor-summary v1, daily in Europe/Paris: runledger (shipped)" in " ".join(
        x.split()) for x in jobs)
    assert line(lines, "mail").startswith(f"ok mail smtp 127.0.0.1:{sink.port} (none) answered 220")
    assert line(lines, "deployments").startswith("skip deployments PREFECT_API_URL is not set")
    assert lines[-1].startswith("0 failed")


# The ledger it checks is a SQLite file of its own: the fixture's ledger is not read.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_empty_ledger_file_fails_and_is_left_as_it_was(
        healthy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A 0-byte file where the ledger should be (a `touch`, a failed copy): the ledger check
    fails naming it and the fix, and the file is neither written nor given WAL files."""
    empty = tmp_path / "copied" / "runledger.db"
    empty.parent.mkdir()
    empty.touch()
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", f"sqlite:///{empty}")
    status, lines = check(healthy)
    assert status == 1, lines
    assert line(lines, "ledger").startswith(f"FAIL ledger no ledger at sqlite:///{empty}")
    assert "is an empty file" in line(lines, "ledger")
    assert "runledger db upgrade" in line(lines, "ledger")
    assert [p.name for p in empty.parent.iterdir()] == ["runledger.db"]
    assert empty.stat().st_size == 0


# The ledger it checks is a SQLite file of its own: the fixture's ledger is not read.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_missing_ledger_a_dead_mail_server_and_a_drifting_schedule_fail_with_their_fix(
        healthy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ledger file (nothing created), nobody on the SMTP port, and a prefect.yaml whose cron
    is an hour off its job's due time: three failures, exit 1."""
    missing = tmp_path / "nowhere" / "runledger.db"
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", f"sqlite:///{missing}")
    with Sink() as sink:
        port = sink.port  # a port nobody listens on once the sink stopped
    monkeypatch.setenv("RUNLEDGER_SMTP_PORT", str(port))
    (healthy / "prefect.yaml").write_text(
        "deployments:\n- name: competitor-summary\n  entrypoint: flows.entrypoints.run_job\n"
        "  parameters: {job: competitor-summary}\n  work_pool: {name: runledger}\n"
        "  schedules:\n  - {cron: '0 8 * * *', timezone: Europe/Paris, slug: daily}\n")
    status, lines = check(healthy)
    assert status == 1, lines
    assert line(lines, "ledger").startswith(f"FAIL ledger no ledger at sqlite:///{missing}")
    assert "RUNLEDGER_DATABASE_URL" in line(lines, "ledger") and not missing.exists()
    assert line(lines, "mail").startswith(f"FAIL mail smtp 127.0.0.1:{port}: ConnectionRefused")
    assert "use cron '0 7 * * *'" in line(lines, "prefect.yaml")
    assert lines[-1].startswith("3 failed")


class StatusServer(LoopbackServer):
    """An HTTP server on loopback answering every request with one status."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status

    def answer(self, request: Request) -> Answer:
        return Answer(self.status, b'{"error": "no such route"}')


def test_a_job_queueing_webhooks_that_delivery_leaves_out_fails_the_check(
        healthy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """competitor-summary with a webhook endpoint while RUNLEDGER_DELIVERY_CHANNELS is left at
    email: a FAIL naming the job, the channel and the fix, exit 1; adding webhook passes."""
    monkeypatch.setenv("RUNLEDGER_COMPETITOR_SUMMARY_WEBHOOK", "summaries-api")
    with Sink() as sink:
        monkeypatch.setenv("RUNLEDGER_SMTP_PORT", str(sink.port))
        status, lines = check(healthy)
        assert status == 1, lines
        assert line(lines, "channels") == (
            "FAIL channels job competitor-summary queues webhook messages, which "
            "RUNLEDGER_DELIVERY_CHANNELS=email does not deliver; add webhook to it")
        assert lines[-1].startswith("1 failed")
        monkeypatch.setenv("RUNLEDGER_DELIVERY_CHANNELS", "email,webhook")
        status, lines = check(healthy)
    assert status == 0, lines
    assert line(lines, "channels") == (
        "ok channels every job's messages go by email, webhook, which "
        "RUNLEDGER_DELIVERY_CHANNELS delivers")


@pytest.mark.parametrize("answer", [404, 500])
def test_a_model_endpoint_answering_anything_but_success_fails_the_check(
        healthy: Path, monkeypatch: pytest.MonkeyPatch, answer: int) -> None:
    """A base URL whose /models answers 404 (a wrong path) or 500: FAIL naming the answer and
    the variable to fix, exit 1."""
    with Sink() as sink, StatusServer(answer) as server:
        monkeypatch.setenv("RUNLEDGER_SMTP_PORT", str(sink.port))
        monkeypatch.setenv("RUNLEDGER_MODEL", "openai")
        monkeypatch.setenv("RUNLEDGER_MODEL_BASE_URL", f"{server.origin}/api")
        monkeypatch.setenv("RUNLEDGER_MODEL_NAME", "probe-model")
        status, lines = check(healthy)
    assert status == 1, lines
    assert line(lines, "model") == (
        f"FAIL model {server.origin}/api/models answered {answer}, not success: "
        "RUNLEDGER_MODEL_BASE_URL must be the base of an OpenAI-compatible API (usually ending "
        "in /v1)")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_missing_postgresql_database_is_told_how_to_be_created(
        healthy: Path, monkeypatch: pytest.MonkeyPatch, db_url: str) -> None:
    """A URL naming a database the server does not have: the createdb command (and its SQL)
    for that host, port and user, not `runledger db upgrade` alone, which cannot create it."""
    missing = f"{db_url.rsplit('/', 1)[0]}/runledger_absent_{uuid.uuid4().hex[:8]}"
    name = missing.rsplit("/", 1)[1]
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", missing)
    monkeypatch.setenv("COLUMNS", "1000")  # the driver's whole error, on one line
    status, lines = check(healthy)
    assert status == 1, lines
    found = line(lines, "ledger")
    assert found.startswith("FAIL ledger no ledger at")
    assert (f"create it with `createdb -h 127.0.0.1 -p 5432 -U postgres {name}` (or the SQL "
            f"`CREATE DATABASE \"{name}\";` as a user allowed to create databases), then "
            "`runledger db upgrade`") in found
