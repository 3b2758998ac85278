"""`runledger run`: one tick in-process, each subject's outcome printed as a table or JSON."""

from __future__ import annotations

import json
import signal
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from typer.testing import CliRunner

from flows.cli import app
from tests.support.pipeline import Env, ModelServer, Reply, Worker, wait_until

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


def test_runledger_run_prints_each_subjects_outcome_as_json(env: Env) -> None:
    """The first run completes every workspace; the second reports duplicates, exit code 0."""
    runner = CliRunner()
    first = runner.invoke(app, ["run", "competitor-summary", "--period", "2026-01-05", "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["state"] == "Completed" and report["period"] == "2026-01-05"
    assert [(s["subject"], s["outcome"], s["outbox_rows"]) for s in report["subjects"]] == [
        ("acme", "new", 2), ("globex", "new", 1)]
    second = runner.invoke(app, ["run", "competitor-summary", "--period", "2026-01-05", "--json",
                                 "--subject", "globex"])
    again = json.loads(second.stdout)
    assert (second.exit_code, again["state"]) == (0, "Duplicate")
    assert again["subjects"][0]["run_id"] == report["subjects"][1]["run_id"]


def test_runledger_run_prints_a_table_of_outcomes_that_fits_80_columns(env: Env) -> None:
    """Without --json each subject is a row with its outcome and short Run id, at 80 columns
    on one line each and nothing cut with an ellipsis."""
    result = CliRunner().invoke(app, ["run", "daily-credit", "--period", "2026-01-05"],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "daily-credit/2026-01-05: 2 new" in result.stdout
    lines = result.stdout.splitlines()
    for run in env.ledger.runs(job="daily-credit"):
        row = next(line for line in lines if run.run_id[:12] in line)
        assert run.subject in row and "new" in row
    assert all(len(line) <= 80 and "…" not in line for line in lines)


def test_runledger_run_names_bad_input_and_exits_2(env: Env) -> None:
    """An unknown job or a naive datetime is one clear line on stderr and exit code 2 (a usage
    error, found before any server starts)."""
    runner = CliRunner()
    unknown = runner.invoke(app, ["run", "no-such-job"])
    naive = runner.invoke(app, ["run", "daily-credit", "--period", "2026-01-05T09:00:00"])
    assert unknown.exit_code == naive.exit_code == 2
    assert "unknown job 'no-such-job'" in unknown.stderr
    assert "naive datetime" in naive.stderr
    assert env.ledger.runs() == []


@pytest.mark.usefixtures("subprocesses_use_the_session_server")
def test_ctrl_c_on_runledger_run_lets_the_model_call_under_way_finish_and_starts_no_other(
        env: Env, model_server: ModelServer) -> None:
    """SIGINT (Ctrl-C) while the first workspace waits for the model: that call finishes and is
    persisted, the second workspace is never collected and is left pending, not leased; the
    flow run ends Cancelled (a person stopped it), not Crashed."""
    env.set(subject_concurrency=1)
    model_server.script.append(Reply(delay=3))
    worker = Worker.start(["competitor-summary", "--period", "2026-01-05"])
    try:
        wait_until(lambda: len(model_server.requests) == 1, 90,
                   "competitor-summary/acme's model call")
        worker.signal(signal.SIGINT)
        code, _, err = worker.finish(timeout=60)
    finally:
        worker.kill()
    assert code != 0, err
    assert env.model_calls() == len(model_server.requests) == 1
    runs = {r.subject: r for r in env.ledger.runs()}
    assert (runs["acme"].status, runs["globex"].status) == ("completed", "pending"), err
    assert runs["globex"].raw_input is None and runs["globex"].owner is None
    assert "cancelled or timed out before collect" in (runs["globex"].error or "")
    flow_run_id = runs["acme"].completed_flow_run_id
    assert flow_run_id is not None
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(flow_run_id)).state
    assert state is not None and state.name == "Cancelled", state
    assert (state.message or "").startswith("stopped by Ctrl-C"), state
