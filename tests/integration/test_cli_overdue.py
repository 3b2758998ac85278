"""`runledger overdue` on both ledgers: what a job owes that is late and why (never started,
stranded, failed, skipped by policy), its unfinished Runs, and an exit status that gates a
script."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner, Result

from flows.cli import app
from flows.jobs import Job
from store import Ledger
from tests.support.alerts import quiet_job
from tests.support.ledger import register_and_claim

# Once a year, on January 1 at 06:00 in Paris: the occurrence of the current year is past due
# whatever day the test runs (a daily job's today would be due or not depending on the hour).
YEARLY = "0 6 1 1 *"
SUBJECTS = ("never", "stranded", "failed", "skipped", "done")


def owing_job(ledger: Ledger, subjects: tuple[str, ...] = SUBJECTS) -> Job:
    """A yearly job owed from this year's period, whose subjects are in the state they name:
    no Run, a pending Run nobody holds, a failed Run, a skip by policy, a completed Run."""
    now = datetime.now(UTC)
    job = quiet_job(cadence=YEARLY, timezone="Europe/Paris", subjects=subjects, start=now,
                    grace=timedelta(minutes=1))
    period = job.period_at(now)
    if "stranded" in subjects:
        ledger.register(job.identity("stranded", period))
    if "failed" in subjects:
        claim = register_and_claim(ledger, job.identity("failed", period), owner="w:1",
                                   lease=60).claim
        assert claim is not None
        ledger.fail(claim, "the model refused the input", retryable=False)
    if "skipped" in subjects:
        ledger.occurrences.skip([(job.identity("skipped", period), "missed while nothing ran (policy skip)")])
    if "done" in subjects:
        claim = register_and_claim(ledger, job.identity("done", period), owner="w:1",
                                   lease=60).claim
        assert claim is not None
        ledger.complete(claim, {"summary": "ok"})
    return job


def test_overdue_lists_what_is_owed_and_late_with_why_and_exits_1(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """Never started, stranded and failed are overdue; the skipped one is listed as skipped by
    policy but not counted; the completed one is not listed."""
    job = owing_job(ledger)
    done = invoke("overdue", "--job", job.name, "--json")
    assert done.exit_code == 1
    listed = json.loads(done.stdout)
    rows = {row["subject"]: row for row in listed["late"]}
    assert {s: (r["state"], r["overdue"]) for s, r in rows.items()} == {
        "never": ("missed", True), "stranded": ("stranded", True),
        "failed": ("failed", True), "skipped": ("skipped", False)}
    assert rows["never"]["why"] == "never started: missed while nothing ran; policy skip"
    assert rows["stranded"]["why"] == "stranded: pending after 0 attempts"
    assert rows["failed"]["why"].startswith("failed: the model refused the input; requeue")
    assert rows["skipped"]["why"] == "skipped by policy: missed while nothing ran (policy skip)"
    year = datetime.now(UTC).year
    for row in rows.values():
        assert row["period"] == f"{year}-01-01T06:00+01:00"
        assert row["due_at"] == f"{year}-01-01T05:00:00+00:00"  # UTC
        assert row["late_seconds"] > 0 and row["job"] == job.name
    # The stranded occurrence's Run is unfinished too: pending, nobody holds it.
    assert [(r["subject"], r["state"], r["owner"]) for r in listed["unfinished"]] == [
        ("stranded", "pending", None)]

    table = invoke("overdue", "--job", job.name)
    assert table.exit_code == 1
    lines = table.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, table.stdout
    assert "never started" in table.stdout and "skipped by policy" in table.stdout
    assert "done" not in table.stdout
    assert "3 overdue, 1 skipped by policy" in lines
    assert lines[-2:] == ["1 unfinished Run: 1 pending",
                          "  pending: the next tick or `runledger reconcile JOB` runs it"]


def test_overdue_exits_0_when_everything_owed_completed_or_was_skipped(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """A skip by policy is listed but is not overdue: the status is 0."""
    job = owing_job(ledger, ("skipped", "done"))
    done = invoke("overdue", "--job", job.name)
    assert done.exit_code == 0, done.stdout
    assert done.stdout.splitlines()[-2:] == ["0 overdue, 1 skipped by policy",
                                             "no unfinished Run"]
    completed = owing_job(ledger, ("done",))
    listed = invoke("overdue", "--job", completed.name, "--json")
    assert (listed.exit_code, json.loads(listed.stdout)) == (0, {"late": [], "unfinished": [],
                                                                   "holds": []})
    assert invoke("overdue", "--job", completed.name).stdout == (
        "nothing owed is late\nno unfinished Run\n")


def test_overdue_exits_1_for_an_unfinished_run_even_when_nothing_owed_is_late(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """A Run of a period the job does not owe (run by hand before its start), left pending, is
    not late but is unfinished: listed, and the status is 1."""
    job = owing_job(ledger, ("done",))
    last_year = job.period_at(datetime.now(UTC) - timedelta(days=366))
    left = ledger.register(job.identity("done", last_year))
    done = invoke("overdue", "--job", job.name, "--json")
    assert done.exit_code == 1, done.stdout
    listed = json.loads(done.stdout)
    assert listed["late"] == []
    assert [(r["run_id"], r["state"]) for r in listed["unfinished"]] == [(left.run_id, "pending")]
    lines = invoke("overdue", "--job", job.name).stdout.splitlines()
    assert lines[0] == "nothing owed is late" and "1 unfinished Run: 1 pending" in lines


def test_overdue_of_an_unknown_job_is_an_error_not_a_verdict(cli: CliRunner) -> None:
    """Exit status 2 and one line naming the known jobs, so a script never reads it as late."""
    done = cli.invoke(app, ["overdue", "--job", "no-such-job"])
    assert done.exit_code == 2
    assert "unknown job 'no-such-job'" in done.stderr
