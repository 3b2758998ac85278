"""The ledger's command line on both dialects: db upgrade, runs list/show, outbox list, demo."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from store import Ledger, OutboxMessage, RunIdentity
from store.errors import LedgerError

PERIOD = datetime(2026, 11, 29, 23, tzinfo=UTC)


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """A CLI runner whose ledger is the test database ($RUNLEDGER_DATABASE_URL)."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", db_url)
    yield CliRunner()


def invoke(cli: CliRunner, *args: str) -> Any:
    return cli.invoke(app, list(args), catch_exceptions=False)


def completed_run(ledger: Ledger, subject: str = "team-a") -> str:
    run = ledger.register(RunIdentity("digest", subject, PERIOD, "v1"))
    claim = ledger.claim(run.run_id, "worker-1:101", 60)
    assert claim is not None
    ledger.complete(claim, {"summary": "ok"}, [OutboxMessage("ana@example.com", "Digest", "b")])
    return run.run_id


def test_db_upgrade_migrates_an_empty_database(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runledger db upgrade` creates the schema on a database that has none."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", empty_db_url)
    ledger = Ledger.connect(empty_db_url)
    try:
        with pytest.raises(LedgerError, match=r"schema is missing.*runledger db upgrade"):
            ledger.runs()
        result = invoke(CliRunner(), "db", "upgrade")
        assert result.exit_code == 0 and "ledger schema at head" in result.output
        assert ledger.runs() == []
    finally:
        ledger.close()


def test_runs_list_json_shows_runs_filtered_by_job_and_status(cli: CliRunner, ledger: Ledger) -> None:
    """`runs list --json` prints the Runs, and --status filters them."""
    done = completed_run(ledger)
    pending = ledger.register(RunIdentity("digest", "team-b", PERIOD, "v1")).run_id
    listed = json.loads(invoke(cli, "runs", "list", "--json").output)
    assert {r["run_id"]: r["status"] for r in listed} == {done: "completed", pending: "pending"}
    only = json.loads(invoke(cli, "runs", "list", "--status", "pending", "--job", "digest", "--json").output)
    assert [r["run_id"] for r in only] == [pending]


def test_runs_show_json_includes_attempts_and_outbox_rows(cli: CliRunner, ledger: Ledger) -> None:
    """`runs show RUN_ID --json` shows the Run, its Attempts and its outbox rows."""
    run_id = completed_run(ledger)
    shown = json.loads(invoke(cli, "runs", "show", run_id, "--json").output)
    assert shown["run"]["status"] == "completed" and shown["run"]["output"] == {"summary": "ok"}
    assert [a["outcome"] for a in shown["attempts"]] == ["completed"]
    assert [m["recipient"] for m in shown["outbox"]] == ["ana@example.com"]


def test_runs_show_of_an_unknown_run_is_a_one_line_error(cli: CliRunner) -> None:
    """An unknown Run id exits 1 with the reason, not a traceback."""
    result = invoke(cli, "runs", "show", "0" * 64)
    assert result.exit_code == 1 and "no run with id" in result.output
    assert "Traceback" not in result.output


def test_outbox_list_json_shows_queued_messages(cli: CliRunner, ledger: Ledger) -> None:
    """`outbox list --json` prints each queued message with its status and key."""
    run_id = completed_run(ledger)
    listed = json.loads(invoke(cli, "outbox", "list", "--status", "pending", "--json").output)
    assert [(m["run_id"], m["recipient"], m["status"]) for m in listed] == [
        (run_id, "ana@example.com", "pending")
    ]


def test_an_unknown_status_filter_is_refused(cli: CliRunner) -> None:
    """A --status outside the known statuses is a usage error."""
    assert invoke(cli, "runs", "list", "--status", "done").exit_code == 2


def test_demo_completes_a_run_once_and_returns_the_duplicate(cli: CliRunner, db_url: str) -> None:
    """`runledger demo` completes today's demo Run, and repeating it stores nothing new."""
    first = invoke(cli, "demo")
    assert first.exit_code == 0, first.output
    assert "new=True" in first.output and "new=False" in first.output
    second = invoke(cli, "demo")
    assert second.exit_code == 0 and "status completed" in second.output
    ledger = Ledger.connect(db_url)
    try:
        [run] = ledger.runs(job="demo")
        assert run.status == "completed" and len(ledger.messages(run_id=run.run_id)) == 1
    finally:
        ledger.close()
