"""The status board on both ledgers: each owed period's occurrences counted by status, the last
complete period, the next one due and what the periods cost (attempts, model calls, tokens and
money, the last two as `runledger costs` reads them); the same board from `runledger status`,
read-only, and a clear error for an unknown job."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from typer.testing import CliRunner

from flows.board import job_board
from flows.cli import app
from flows.jobs import Job
from store import CompletedBy, Intent, Ledger, Period, Usage
from store.models import obligations_table, occurrences_table
from tests.support.alerts import quiet_job
from tests.support.ledger import register_and_claim, snapshot

START = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 1, 3, 12, 0, tzinfo=UTC)  # 2026-01-03 is due, not yet past its grace
SUBJECTS = ("done", "failed", "skipped", "pending", "running", "never")


def complete(ledger: Ledger, job: Job, subject: str, period: Period, calls: int = 1,
             usage: Usage | None = None) -> None:
    """Complete the subject's Run; with ``usage``, after one model call answered with it."""
    claim = register_and_claim(ledger, job.identity(subject, period), owner="w:1", lease=600).claim
    assert claim is not None
    if usage is not None:
        call = ledger.calls.record_intent(claim, Intent("loopback", "m", 0, "3" * 64))
        ledger.calls.record_answer(call, {"text": "ok"}, usage)
    ledger.complete(claim, {"text": "ok"}, by=CompletedBy(calls))


def owing_job(ledger: Ledger) -> Job:
    """A daily job owed from 2026-01-01, with two days' grace: on 01-01 only ``done`` completed
    (the rest is past its grace at NOW), on 01-02 everyone did, and on 01-03 each subject is
    in the state it names."""
    job = quiet_job(cadence="daily", timezone="UTC", subjects=SUBJECTS, start=START,
                    grace=timedelta(days=2))
    first, second, third = (job.period_at(START + timedelta(days=d)) for d in range(3))
    complete(ledger, job, "done", first)
    for subject in SUBJECTS:
        complete(ledger, job, subject, second)
    complete(ledger, job, "done", third, calls=2)
    failed = register_and_claim(ledger, job.identity("failed", third), owner="w:1",
                                lease=600).claim
    assert failed is not None
    ledger.fail(failed, "the model refused the input", retryable=False, model_calls=1)
    ledger.occurrences.skip([(job.identity("skipped", third), "missed while nothing ran (policy skip)")])
    ledger.register(job.identity("pending", third))
    register_and_claim(ledger, job.identity("running", third), owner="w:2", lease=600)
    return job


def counts(row: dict[str, Any]) -> dict[str, int]:
    return {k: row[k] for k in ("completed", "pending", "running", "failed", "skipped",
                                "overdue")}


def test_the_board_counts_each_owed_period_by_status_with_what_its_runs_spent(
        ledger: Ledger) -> None:
    """Newest period first: 01-03 has one subject per status, 01-02 is the last complete one,
    01-01's unfinished subjects are overdue; attempts and model calls are the Runs' own."""
    job = owing_job(ledger)
    board = job_board(ledger, job, NOW)
    assert [r["period"] for r in board.rows()] == ["2026-01-03", "2026-01-02", "2026-01-01"]
    third, second, first = board.rows()
    assert counts(third) == {"completed": 1, "pending": 2, "running": 1, "failed": 1,
                             "skipped": 1, "overdue": 0}
    assert (third["attempts"], third["model_calls"]) == (3, 3)
    assert counts(second) == {"completed": 6, "pending": 0, "running": 0, "failed": 0,
                              "skipped": 0, "overdue": 0}
    assert counts(first) == {"completed": 1, "pending": 0, "running": 0, "failed": 0,
                             "skipped": 0, "overdue": 5}
    assert board.last_complete is not None and board.last_complete.label == "2026-01-02"
    assert (board.next_due.label, board.next_due_at) == ("2026-01-04",
                                                         datetime(2026, 1, 4, tzinfo=UTC))
    assert (board.attempts, board.model_calls) == (3 + 6 + 1, 3 + 6 + 1)
    assert "last complete period 2026-01-02; next due 2026-01-04" in board.summary()


def test_an_occurrence_reconcile_reported_overdue_is_overdue_on_the_board_within_its_grace(
        ledger: Ledger) -> None:
    """The ledger's occurrences decide too: one reported overdue (say with a shorter grace
    then) counts as overdue, not pending, until its Run completes."""
    job = owing_job(ledger)
    ledger.occurrences.mark_overdue([job.identity("never", job.period_at(NOW))])
    third = job_board(ledger, job, NOW).rows()[0]
    assert (third["pending"], third["overdue"]) == (1, 1)


def test_the_board_shows_only_the_periods_asked_for_newest_first(ledger: Ledger) -> None:
    """``periods`` bounds the board: two periods are 01-03 and 01-02, and the costs are theirs."""
    job = owing_job(ledger)
    board = job_board(ledger, job, NOW, periods=2)
    assert [r["period"] for r in board.rows()] == ["2026-01-03", "2026-01-02"]
    assert board.attempts == 3 + 6


def test_the_board_of_a_job_nothing_is_owed_by_yet_says_so(ledger: Ledger) -> None:
    """Before its first period is due a job's board is empty and names that period next."""
    job = quiet_job(cadence="daily", timezone="UTC", subjects=("acme",), start=NOW)
    board = job_board(ledger, job, NOW - timedelta(days=1))
    assert board.rows() == []
    assert board.next_due.label == "2026-01-03"
    assert board.summary().endswith("no period owed yet")


def test_reading_the_board_writes_nothing(ledger: Ledger) -> None:
    """A board is a dry run of reconcile's plan: no obligation, occurrence or Run is written."""
    job = owing_job(ledger)

    def everything() -> dict[str, Any]:
        with ledger.engine.connect() as conn:
            owed = [tuple(r) for t in (obligations_table, occurrences_table)
                    for r in conn.execute(sa.select(t))]
        return {**snapshot(ledger), "owed": owed}

    before = everything()
    job_board(ledger, job, NOW)
    assert everything() == before


def test_status_prints_each_jobs_board_as_a_table_and_as_json(
        cli: CliRunner, ledger: Ledger) -> None:
    """`runledger status JOB` shows the board of the database clock's now: yesterday complete,
    today's subject running; `--json` carries the same numbers."""
    now = ledger.now()
    job = quiet_job(cadence="daily", timezone="UTC", subjects=("acme",),
                    start=now - timedelta(days=1), grace=timedelta(days=1))
    yesterday, today = job.period_at(now - timedelta(days=1)), job.period_at(now)
    complete(ledger, job, "acme", yesterday, calls=3)
    register_and_claim(ledger, job.identity("acme", today), owner="w:1", lease=600)
    shown = cli.invoke(app, ["status", job.name], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert f"last complete period {yesterday.label}" in shown.output
    assert today.label in shown.output and "running" in shown.output
    printed = cli.invoke(app, ["status", job.name, "--json"], catch_exceptions=False)
    [board] = json.loads(printed.output)
    assert board["last_complete_period"] == yesterday.label
    assert [(p["period"], p["completed"], p["running"]) for p in board["periods"]] == [
        (today.label, 0, 1), (yesterday.label, 1, 0)]
    assert (board["attempts"], board["model_calls"]) == (2, 3)


def test_the_board_shows_what_each_periods_model_calls_cost_as_runledger_costs_reads_them(
        cli: CliRunner, ledger: Ledger) -> None:
    """Yesterday two calls priced in EUR, the day before one without a price: each period's
    tokens and cost on the board, in `runledger status` and its JSON; the board's total is
    what `runledger costs` says the job spent over the same days."""
    now = ledger.now()
    job = quiet_job(cadence="daily", timezone="UTC", subjects=("a", "b"),
                    start=now - timedelta(days=2), grace=timedelta(days=3))
    earlier, yesterday = (job.period_at(now - timedelta(days=d)) for d in (2, 1))
    complete(ledger, job, "a", yesterday, usage=Usage(1000, 200, 9, 450_000, "EUR"))
    complete(ledger, job, "b", yesterday, usage=Usage(1000, 200, 9, 550_000, "EUR"))
    complete(ledger, job, "a", earlier, usage=Usage(100, 20, 9))
    board = job_board(ledger, job, now)
    rows = {r["period"]: r for r in board.rows()}
    assert (rows[yesterday.label]["tokens"], rows[yesterday.label]["cost"]) == (
        2400, "0.001000 EUR")
    assert (rows[earlier.label]["tokens"], rows[earlier.label]["cost"]) == (120, "no price")
    assert "2520 tokens, cost 0.001000 EUR + 1 call with no price" in board.summary()
    costs = cli.invoke(app, ["costs", "--job", job.name, "--since", earlier.label, "--json"],
                       catch_exceptions=False)
    [spent] = json.loads(costs.output)["jobs"]
    assert board.spend.as_dict() == spent["spent"] and board.spend.paid == 3
    shown = cli.invoke(app, ["status", job.name], catch_exceptions=False,
                       env={"COLUMNS": "200"})
    assert "0.001000 EUR" in shown.output and "no price" in shown.output
    [printed] = json.loads(cli.invoke(app, ["status", job.name, "--json"]).output)
    assert printed["spend"] == spent["spent"]
    assert [(p["period"], p["tokens"]) for p in printed["periods"]][-2:] == [
        (yesterday.label, 2400), (earlier.label, 120)]


def test_status_of_an_unknown_job_is_a_one_line_error_naming_the_known_jobs(
        cli: CliRunner, ledger: Ledger) -> None:
    """A typo is exit status 1, one error (no traceback) naming the registered jobs, and
    nothing written."""
    before = snapshot(ledger)
    shown = cli.invoke(app, ["status", "no-such-job"], catch_exceptions=False)
    assert shown.exit_code == 1
    assert "unknown job 'no-such-job'; registered jobs:" in shown.output
    assert shown.output.startswith("error: ") and "Traceback" not in shown.output
    assert snapshot(ledger) == before
