"""`runledger backfill`: the backfill flow in-process with a progress bar and a summary table,
its JSON, its dry run and its refusals (on the session's Prefect server, PostgreSQL ledger)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.jobs import PermanentError
from flows.registry import get_job
from tests.support.pipeline import (
    RUNLEDGER,
    Env,
    ModelServer,
    Reply,
    probe_job,
    wait_until,
)

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
RANGE = ["--from", "2026-01-01", "--to", "2026-01-04"]


def backfill(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["backfill", *args], env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


def fits_80_columns(text: str) -> bool:
    return all(len(line) <= 80 and "…" not in line for line in text.splitlines())


def test_runledger_backfill_shows_its_progress_and_a_summary_of_every_period(env: Env) -> None:
    """periods x subjects done with the new / duplicate / failed counts, then a row per period;
    the same command again runs nothing and says every Run was a duplicate."""
    probe = probe_job(("acme", "globex"))
    code, out, _ = backfill(probe.name, *RANGE)
    assert code == 0, out
    assert "8 new, 0 duplicate, 0 failed" in out and "8/8" in out
    assert f"backfill {probe.name} 2026-01-01..2026-01-04: 4 of 4" in out
    rows = [line for line in out.splitlines() if line.startswith("│ 2026-01-0")]
    assert [row.split("│")[1:4] for row in rows] == [
        [f" 2026-01-0{day} ", " 2   ", " 0         "] for day in range(1, 5)]
    assert fits_80_columns(out) and env.model_calls() == 8
    code, again, _ = backfill(probe.name, *RANGE)
    assert code == 0 and "0 new, 8 duplicate, 0 failed" in again and env.model_calls() == 8


def test_runledger_backfill_dry_run_prints_the_plan_and_writes_nothing(env: Env) -> None:
    """Per period the subjects to run and how many are completed, failed and skipped; no Run
    is registered, and --json gives the same plan with subject names."""
    probe = probe_job(("acme", "globex"))
    code, out, _ = backfill(probe.name, "--from", "2026-01-02", "--to", "2026-01-02")
    assert code == 0
    code, out, _ = backfill(probe.name, *RANGE, "--dry-run")
    assert code == 0, out
    assert "dry run: backfill" in out and "6 to run, 2 completed" in out
    assert [line.split("│")[1:4] for line in out.splitlines() if line.startswith("│ 2026")] == [
        [" 2026-01-01 ", " acme, globex ", " 0         "],
        [" 2026-01-02 ", " -            ", " 2         "],
        [" 2026-01-03 ", " acme, globex ", " 0         "],
        [" 2026-01-04 ", " acme, globex ", " 0         "]]
    code, text, _ = backfill(probe.name, *RANGE, "--dry-run", "--json", "-s", "globex")
    plan = json.loads(text)
    assert code == 0 and plan["dry_run"] and plan["subjects"] == ["globex"]
    assert [p["run"] for p in plan["plan"]] == [["globex"], [], ["globex"], ["globex"]]
    assert len(env.ledger.runs(job=probe.name)) == 2 and env.model_calls() == 2


def test_runledger_backfill_json_reports_each_subject_and_exits_1_when_one_failed(
        env: Env) -> None:
    """The JSON names every period's flow run and each subject's outcome; a permanent failure
    makes the exit status 1, and the progress went to stderr."""
    probe = probe_job(("acme",), transform_errors=[PermanentError("unreadable source")])
    code, out, err = backfill(probe.name, "--from", "2026-01-01", "--to", "2026-01-02",
                              "--max-active", "1", "--json")
    assert code == 1, err
    report = json.loads(out)
    assert report["counts"] == {"failed": 1, "new": 1}
    assert [[s["outcome"] for s in p["subjects"]] for p in report["periods"]] == [
        ["failed"], ["new"]]
    assert all(p["flow_run_id"] for p in report["periods"]) and report["flow_run_id"]
    assert "1 new, 0 duplicate, 1 failed" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--from", "2026-01-04", "--to", "2026-01-01"], "is before start 2026-01-04"),
    ([*RANGE, "-s", "initech"], "has no subject 'initech'"),
    ([*RANGE, "--rate", "fast"], "--rate must be a number of periods per minute"),
    ([*RANGE, "--reprocess", "completed"], "reprocess must be one of none, failed, skipped"),
    ([*RANGE, "--max-active", "0"], "max_active must be a whole number of 1 or more"),
    (["--from", "2026-01-01", "--to", "2099-01-01"],
     "is not due until 2099-01-01 00:00 UTC"),
], ids=["end-before-start", "unknown-subject", "bad-rate", "bad-reprocess", "bad-max-active",
        "not-due"])
def test_runledger_backfill_names_bad_input_and_exits_2_having_written_nothing(
        env: Env, args: list[str], message: str) -> None:
    """One line on stderr naming the problem and the fix, exit 2 (a usage error, found before
    any ledger or server), no Run."""
    probe = probe_job(("acme", "globex"))
    code, _, err = backfill(probe.name, *args)
    assert code == 2 and message in " ".join(err.split())
    assert env.ledger.runs(job=probe.name) == []


def test_ctrl_c_on_runledger_backfill_starts_no_further_period_and_leaves_no_run_leased(
        env: Env, prefect_api: str, model_server: ModelServer) -> None:
    """SIGINT while the first day's first workspace waits for the model: that call finishes and
    is persisted, the day's other workspace is released, and no later day is registered."""
    env.set(subject_concurrency=1)
    model_server.script.append(Reply(delay=3))
    process = subprocess.Popen(
        [*RUNLEDGER, "backfill", "competitor-summary", "--from", "2026-01-01", "--to", "2026-01-03",
         "--max-active", "1"], env={**os.environ, "PREFECT_API_URL": prefect_api},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(model_server.requests) == 1, 90,
                   "the first workspace's model call")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)
    assert process.returncode != 0, err
    runs = env.ledger.runs(job="competitor-summary")
    first_day = get_job("competitor-summary").parse_period("2026-01-01").start
    assert {r.period_start for r in runs} == {first_day}, err
    assert sorted(r.status for r in runs) == ["completed", "pending"], err
    assert all(r.owner is None for r in runs)
    assert env.model_calls() == len(model_server.requests) == 1
