"""A new user's first `runledger run`: no PREFECT_API_URL, so Prefect starts its temporary
server; a successful tick prints its table and nothing that looks like a failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.pipeline import RUNLEDGER, copy_sample_data

pytestmark = pytest.mark.processes


def first_run_env(tmp_path: Path) -> dict[str, str]:
    """This machine's environment without any Prefect or runledger setting (the test session's
    own turn analytics off, which is what the CLI must do by itself), then a fresh Prefect home,
    a SQLite ledger file and the offline model."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RUNLEDGER_"))}
    env.update({
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "RUNLEDGER_DATABASE_URL": f"sqlite:///{tmp_path / 'runledger.db'}",
        "RUNLEDGER_MODEL": "offline",
        "RUNLEDGER_COMPETITOR_SUMMARY_SOURCE": str(copy_sample_data(tmp_path / "source")),
        "COLUMNS": "80",
    })
    return env


def test_a_successful_runledger_run_on_a_temporary_server_prints_no_error(tmp_path: Path) -> None:
    """Exit 0 with the tick's table, and neither stdout nor stderr says ERROR or Traceback
    (Prefect's temporary server used to log failed telemetry heartbeats, with tracebacks)."""
    done = subprocess.run(
        [*RUNLEDGER, "run", "competitor-summary", "--period", "2026-11-20"],
        env=first_run_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "competitor-summary/2026-11-20: 2 new" in done.stdout
    for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        assert "ERROR" not in text and "Traceback" not in text, f"{stream}:\n{text}"
