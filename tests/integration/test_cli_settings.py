"""A bad setting, from every command: one line per bad variable naming it, its value and the
fix, exit status 2, no traceback, and nothing written (the ledger file is never created)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

COMMANDS = [["check"], ["run", "competitor-summary"], ["runs", "list"], ["deliver"],
            ["status"], ["outbox", "list"], ["db", "upgrade"]]


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ledger path no command has created yet."""
    path = tmp_path / "runledger.db"
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", f"sqlite:///{path}")
    monkeypatch.setenv("COLUMNS", "80")  # a line longer than the terminal stays one line
    return path


def refused(args: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    return result.exit_code, result.stderr.splitlines()


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_negative_rate_is_one_line_naming_the_variable_from_every_command(
        args: list[str], ledger_file: Path) -> None:
    """RUNLEDGER_MODEL_REQUESTS_PER_MINUTE=-5: the variable, its value, the rule and what
    unsetting it means, on one line; exit 2; no ledger file."""
    status, lines = refused(args, {"RUNLEDGER_MODEL_REQUESTS_PER_MINUTE": "-5"})
    assert (status, lines) == (2, [
        "error: RUNLEDGER_MODEL_REQUESTS_PER_MINUTE=-5: must be greater than 0 (or unset: no "
        "limit, learned from 429s)"])
    assert not ledger_file.exists()


def test_every_bad_variable_of_every_settings_class_gets_its_own_line(ledger_file: Path) -> None:
    """Three bad variables of three settings classes (the model's, the ledger's, delivery's):
    three lines, each with the allowed values or the default unsetting gives."""
    status, lines = refused(["check"], {
        "RUNLEDGER_MODEL": "gpt", "RUNLEDGER_MAX_OUTPUT_BYTES": "lots",
        "RUNLEDGER_DELIVERY_CHANNELS": "email,sms"})
    assert status == 2
    assert lines == [
        "error: RUNLEDGER_MODEL=gpt: must be 'offline', 'openai' or 'anthropic' (or unset: "
        "offline)",
        "error: RUNLEDGER_MAX_OUTPUT_BYTES=lots: must be a valid integer, unable to parse string "
        "as an integer (or unset: 1000000)",
        "error: RUNLEDGER_DELIVERY_CHANNELS=email,sms: must list channels among email, webhook, "
        "object, got 'email,sms' (or unset: email)"]
    assert not ledger_file.exists()


def test_a_bad_entry_of_a_json_setting_names_its_path(ledger_file: Path) -> None:
    """A named endpoint with a rate of 0 in RUNLEDGER_ENDPOINTS: the variable and the entry."""
    status, lines = refused(["runs", "list"], {"RUNLEDGER_ENDPOINTS": (
        '{"fast": {"base_url": "http://127.0.0.1:9/v1", "model_name": "m", '
        '"requests_per_minute": 0}}')})
    assert (status, lines) == (2, [
        "error: RUNLEDGER_ENDPOINTS (fast.requests_per_minute=0): must be greater than 0"])


def test_a_rule_across_variables_is_one_line_naming_them(ledger_file: Path) -> None:
    """Prices without their currency: the line names both variables; the API key set beside
    them does not reach the terminal."""
    status, lines = refused(["check"], {
        "RUNLEDGER_MODEL_PRICES": '{"m": {"input": 1, "output": 2}}',
        "RUNLEDGER_MODEL_API_KEY": "sk-very-secret"})
    assert (status, lines) == (2, [
        "error: RUNLEDGER_MODEL_PRICES needs RUNLEDGER_MODEL_CURRENCY, an ISO 4217 code such as "
        "USD"])


def test_a_jobs_own_setting_read_inside_a_command_is_one_line_too(ledger_file: Path) -> None:
    """A job's settings class (competitor-summary's), read only when the job is loaded."""
    status, lines = refused(["run", "competitor-summary"], {
        "RUNLEDGER_COMPETITOR_SUMMARY_MAX_SUMMARY_CHARS": "many"})
    assert (status, lines) == (2, [
        "error: RUNLEDGER_COMPETITOR_SUMMARY_MAX_SUMMARY_CHARS=many: must be a valid integer, "
        "unable to parse string as an integer (or unset: 2000)"])
    assert not ledger_file.exists()
