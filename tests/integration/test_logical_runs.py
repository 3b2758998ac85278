"""Logical runs versus attempts on both ledgers: what a completion and a failure record about
the Attempt that made them (model calls, flow run, task run), and what an operator reads of a
Run in `runs show` and `runs list --json`: run key, period in the job's timezone and UTC, attempt numbers,
input version, duration, output location and final state."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings
from typer.testing import CliRunner

from flows.cli import app
from store import CompletedBy, InvalidInput, Ledger, RunIdentity, document_digest
from tests.support.alerts import quiet_job
from tests.support.ledger import register_and_claim, snapshot

FLOW_RUN = "6f1c7a52-2c4e-4b9e-9d0a-3f5b8e1c2d4a"
TASK_RUN = "0192f0a1-7b3c-7d4e-8f5a-6b7c8d9e0f1a"
RAW = {"items": ["shipped search", "fixed billing bug"]}


def twice_attempted(ledger: Ledger) -> tuple[Any, str]:
    """A Paris daily job's Run whose first Attempt failed transiently after one model call and
    whose second completed after two, in a flow run and task run: the job and the run id."""
    job = quiet_job(cadence="daily", timezone="Europe/Paris")
    identity = job.identity("acme", job.parse_period("2026-03-29"))  # a 23-hour day (DST)
    first = register_and_claim(ledger, identity, owner="w:1", lease=600).claim
    assert first is not None
    ledger.save_input(first, RAW)
    ledger.fail(first, "ModelUnavailable: HTTP 503", retryable=True, model_calls=1)
    second = ledger.claim(identity.run_id, "w:2", 600)
    assert second is not None
    ledger.complete(second, {"text": "ok"}, by=CompletedBy(2, FLOW_RUN, TASK_RUN))
    return job, identity.run_id


def test_a_completion_and_a_failure_record_their_attempts_model_calls_and_where_it_ran(
        ledger: Ledger) -> None:
    """Each Attempt keeps its own calls, the Run their sum, and the completing one's flow run
    and task run are the Run's output location."""
    _, run_id = twice_attempted(ledger)
    run = ledger.get(run_id)
    assert (run.status, run.model_calls) == ("completed", 3)
    assert (run.completed_flow_run_id, run.completed_task_run_id) == (FLOW_RUN, TASK_RUN)
    assert [(a.fence, a.outcome, a.model_calls) for a in ledger.attempts(run_id)] == [
        (1, "released", 1), (2, "completed", 2)]


def test_a_negative_count_of_model_calls_is_refused_and_writes_nothing(ledger: Ledger) -> None:
    """Model calls are a count: -1 is a clear error and the Run stays as it was, claimed."""
    identity = RunIdentity("digest", "team-a", datetime.fromisoformat("2026-01-05T00:00Z"), "1")
    claim = register_and_claim(ledger, identity, owner="w:1", lease=600).claim
    assert claim is not None
    before = snapshot(ledger)
    with pytest.raises(InvalidInput, match="model_calls must be an integer of 0 or more"):
        ledger.complete(claim, {"text": "ok"}, by=CompletedBy(-1))
    with pytest.raises(InvalidInput, match="model_calls must be an integer of 0 or more"):
        ledger.fail(claim, "boom", model_calls=-1)
    assert snapshot(ledger) == before


def show(cli: CliRunner, run_id: str) -> dict[str, Any]:
    done = cli.invoke(app, ["runs", "show", run_id, "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return json.loads(done.output)  # type: ignore[no-any-return]


def test_runs_show_json_carries_the_period_attempts_input_version_duration_and_location(
        cli: CliRunner, ledger: Ledger) -> None:
    """The period in Paris time and UTC (a 23-hour day), attempt numbers 1 and 2, the digest
    of the stored raw input, first claim to completion, the flow run and task run as UI links
    when Prefect's UI URL is known, and the final state."""
    _, run_id = twice_attempted(ledger)
    run, attempts = ledger.get(run_id), ledger.attempts(run_id)
    with temporary_settings({PREFECT_UI_URL: "http://prefect.example:4200"}):
        shown = show(cli, run_id)
        text = cli.invoke(app, ["runs", "show", run_id], catch_exceptions=False,
                          env={"COLUMNS": "200"}).output
    record = shown["run"]
    assert record["run_key"] == run_id and record["final_state"] == "completed"
    assert record["period_window"] == {
        "label": "2026-03-29", "timezone": "Europe/Paris",
        "start": "2026-03-29T00:00:00+01:00", "end": "2026-03-30T00:00:00+02:00",
        "start_utc": "2026-03-28T23:00:00+00:00", "end_utc": "2026-03-29T22:00:00+00:00"}
    assert record["attempt_numbers"] == [1, 2]
    assert record["input_version"] == document_digest(RAW)
    assert run.completed_at is not None and attempts[0].started_at is not None
    expected = round((run.completed_at - attempts[0].started_at).total_seconds(), 3)
    assert record["duration_seconds"] == expected
    assert record["output_location"] == {
        "flow_run_id": FLOW_RUN, "task_run_id": TASK_RUN,
        "flow_run_url": f"http://prefect.example:4200/runs/flow-run/{FLOW_RUN}",
        "task_run_url": f"http://prefect.example:4200/runs/task-run/{TASK_RUN}"}
    assert [(a["number"], a["model_calls"]) for a in shown["attempts"]] == [(1, 1), (2, 2)]
    assert all(a["duration_seconds"] is not None and a["duration_seconds"] >= 0
               for a in shown["attempts"])
    assert "period 2026-03-29T00:00:00+01:00 to 2026-03-30T00:00:00+02:00 (Europe/Paris)" in text
    assert f"input version {document_digest(RAW)}" in text
    assert f"completed by flow run http://prefect.example:4200/runs/flow-run/{FLOW_RUN}" in text


def test_runs_list_json_carries_the_same_record_as_runs_show_for_every_run(
        cli: CliRunner, ledger: Ledger) -> None:
    """One list read and one read of all their Attempts give each Run the fields `runs show`
    gives it (without its documents), here without UI links: no Prefect address is set."""
    job, run_id = twice_attempted(ledger)
    pending = ledger.register(job.identity("globex", job.parse_period("2026-03-29"))).run_id
    # The session's temporary Prefect server, if a test started it, sets PREFECT_API_URL.
    with temporary_settings(restore_defaults={PREFECT_API_URL, PREFECT_UI_URL}):
        listed = cli.invoke(app, ["runs", "list", "--job", job.name, "--json"],
                            catch_exceptions=False)
        shown = show(cli, run_id)["run"]
    by_id = {r["run_id"]: r for r in json.loads(listed.output)}
    assert set(by_id) == {run_id, pending}
    assert by_id[run_id] == {k: v for k, v in shown.items() if k not in ("raw_input", "output")}
    assert by_id[run_id]["output_location"]["flow_run_url"] is None
    assert (by_id[pending]["attempt_numbers"], by_id[pending]["input_version"],
            by_id[pending]["duration_seconds"], by_id[pending]["final_state"]) == (
        [], None, None, "pending")


def test_a_run_of_a_job_not_registered_here_shows_its_utc_start_and_no_end(
        cli: CliRunner, ledger: Ledger) -> None:
    """Without the job's cadence the period's end is unknown: said so, not guessed."""
    identity = RunIdentity("retired-job", "team-a", datetime.fromisoformat("2026-01-05T09:00Z"),
                           "1")
    ledger.register(identity)
    window = show(cli, identity.run_id)["run"]["period_window"]
    assert window == {"label": "2026-01-05T09:00+00:00", "timezone": None, "start": None,
                      "end": None, "start_utc": "2026-01-05T09:00:00+00:00", "end_utc": None}
