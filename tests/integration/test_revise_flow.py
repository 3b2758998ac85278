"""The revise flow on both ledgers and a real Prefect server: a completed Run's next revision
goes through the same stages as a tick (one model call, the stored input reused), queues new
outbox rows with new keys and a "revised" subject, leaves the original untouched, and is
idempotent per request; `runledger runs revise` runs it in-process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from prefect import State
from sqlmodel import Session
from typer.testing import CliRunner

from flows.board import job_board
from flows.cli import app
from flows.errors import PeriodNotDue
from flows.run_job.flow import run_job
from flows.run_job.outcomes import outcome_name
from flows.run_job.revision import RevisionReport, revise
from store import RevisionInProgress, RunIdentity
from tests.support.killed import run_killed
from tests.support.pipeline import (
    ACME,
    RUNLEDGER,
    SUMMARY,
    Env,
    final_state,
    lease_expired,
    outbox_recipients,
    outcomes,
    probe_job,
    wait_until,
)

PERIOD = "2026-01-05"


# Its worker and CLI subprocesses, too, use the session's Prefect server.
pytestmark = pytest.mark.usefixtures("subprocesses_use_the_session_server")


def revised(**parameters: Any) -> tuple[State[Any], RevisionReport | BaseException]:
    state = final_state(revise(**parameters, return_state=True))
    return state, state.result(raise_on_failure=False)


def report_of(result: RevisionReport | BaseException) -> RevisionReport:
    assert isinstance(result, RevisionReport), result
    return result


def test_a_revision_of_a_completed_run_calls_the_model_once_and_resends_with_new_keys(
        env: Env) -> None:
    """Revision 1 reuses the stored raw input (collect is not called), makes one model call and
    queues one message per recipient under new keys with "revised" in the subject; the
    original's row and messages are untouched; a rerun of the period reads revision 1."""
    probe = probe_job()
    state, _ = env.run(probe.name, period=PERIOD)
    original = env.the_run("acme", PERIOD, probe.job)
    before = env.ledger.outbox.messages(run_id=original.run_id)
    state, result = revised(run_id=original.run_id, reason="model fixed")
    report = report_of(result)
    assert outcome_name(state) == "Revised" and "revision 1" in (state.message or "")
    assert "model fixed" in (state.message or "")
    revision = env.ledger.get(report.run.run_id)
    assert (revision.revision, revision.revises_run_id, revision.status) == (
        1, original.run_id, "completed")
    assert probe.collects == ["acme"] and probe.transforms == ["acme", "acme"]
    assert revision.raw_input == original.raw_input and revision.model_calls == 1
    messages = env.ledger.outbox.messages(run_id=revision.run_id)
    assert sorted(m.recipient for m in messages) == ["a@example.com", "b@example.com"]
    assert all(m.subject == f"acme {PERIOD} (revised, revision 1)" for m in messages)
    assert not {m.message_id for m in messages} & {m.message_id for m in before}
    assert env.ledger.get(original.run_id) == original
    assert env.ledger.outbox.messages(run_id=original.run_id) == before
    state, again = env.run(probe.name, period=PERIOD)
    assert outcome_name(state) == "Duplicate" and outcomes(again) == {"acme": "duplicate"}
    assert again.subjects[0].run_id == revision.run_id  # type: ignore[union-attr]
    [period] = job_board(env.ledger, probe.job, datetime(2026, 1, 5, 12, tzinfo=UTC),
                         periods=1).periods
    assert dict(period.counts) == {"completed": 1}  # the revision is no second occurrence


def test_recollect_collects_again_and_no_resend_queues_nothing(env: Env) -> None:
    """--recollect calls collect again; --no-resend completes the revision without outbox rows."""
    probe = probe_job()
    env.run(probe.name, period=PERIOD)
    original = env.the_run("acme", PERIOD, probe.job)
    state, result = revised(run_id=original.run_id, reason="source fixed", recollect=True,
                            resend=False)
    assert outcome_name(state) == "Revised" and "nothing resent" in (state.message or "")
    assert probe.collects == ["acme", "acme"]
    assert env.ledger.outbox.messages(run_id=report_of(result).run.run_id) == []


def test_rerunning_the_same_revise_request_does_not_make_a_second_revision(env: Env) -> None:
    """The same request (a retried revise flow run) finds its revision: completed, it ends as
    Duplicate with no model call; another request while none is unfinished makes revision 2."""
    from flows.run_job.revision import run_revision
    from flows.run_job.stop import Stop
    from flows.settings import RunledgerSettings

    probe = probe_job()
    env.run(probe.name, period=PERIOD)
    original = env.the_run("acme", PERIOD, probe.job)
    args = (original.run_id, "again", False, True, None, RunledgerSettings())

    def request(flow_run_id: str) -> RevisionReport:
        async def in_flow() -> RevisionReport:
            return await asyncio.to_thread(run_revision, *args, flow_run_id, Stop())

        return cast(RevisionReport, asyncio.run(_in_a_flow(in_flow)))

    first = request("11111111-1111-1111-1111-111111111111")
    again = request("11111111-1111-1111-1111-111111111111")
    assert (first.outcome, again.outcome) == ("new", "duplicate")
    assert again.run.run_id == first.run.run_id and len(probe.transforms) == 2
    assert [r.revision for r in env.ledger.revisions(original.run_id)] == [0, 1]


async def _in_a_flow(call: Any) -> Any:
    """``call`` inside a flow run, as the revise flow's own thread would run."""
    from prefect import flow

    @flow(name="revise-request-probe", persist_result=False)
    async def probe_flow() -> Any:
        return await call()

    return await probe_flow()


def test_a_request_while_a_revision_is_unfinished_fails_the_flow_run_naming_it(
        env: Env) -> None:
    """A revision left pending (requested, its flow run gone) blocks a second request, which
    fails with RevisionInProgress naming it; revising the pending revision's id resumes and
    completes it."""
    probe = probe_job()
    env.run(probe.name, period=PERIOD)
    original = env.the_run("acme", PERIOD, probe.job)
    pending = env.ledger.request_revision(original.run_id, "first").run
    state, result = revised(run_id=original.run_id, reason="second")
    assert state.is_failed() and isinstance(result, RevisionInProgress)
    assert pending.run_id in str(result)
    state, result = revised(run_id=pending.run_id, reason="resume")
    assert outcome_name(state) == "Revised" and report_of(result).run.run_id == pending.run_id
    assert [r.status for r in env.ledger.revisions(original.run_id)] == ["completed"] * 2


def test_revising_an_uncompleted_run_fails_and_writes_nothing(env: Env) -> None:
    """A Run that never completed is refused (rerun or requeue it); nothing is written."""
    probe = probe_job()
    identity = probe.job.identity("acme", probe.job.parse_period(PERIOD))
    run = env.ledger.register(identity, probe.job.run_params("acme",
                                                             probe.job.parse_period(PERIOD)))
    state, result = revised(run_id=run.run_id, reason="why")
    assert state.is_failed() and "never completed" in str(result)
    assert [r.run_id for r in env.ledger.revisions(run.run_id)] == [run.run_id]


def test_new_params_for_changed_recipients_go_to_the_new_recipients(env: Env) -> None:
    """The job's recipients changed: a tick of the period is a conflict naming `runs revise`;
    a revision with the new params explicitly queues mail to the new recipients only, and the
    period's tick is a Duplicate of it afterwards; params other than the job's are refused."""
    recipients = ["a@example.com"]
    probe = probe_job(recipients=recipients)
    env.run(probe.name, period=PERIOD)
    original = env.the_run("acme", PERIOD, probe.job)
    recipients[:] = ["new@example.com"]
    state, _ = env.run(probe.name, period=PERIOD)
    assert state.is_failed() and "runledger runs revise" in (state.message or "")
    state, result = revised(run_id=original.run_id, reason="recipients changed",
                            params={"recipients": ["other@example.com"]})
    assert state.is_failed() and "pass --params" in str(result)
    state, result = revised(run_id=original.run_id, reason="recipients changed",
                            params={"recipients": ["new@example.com"]})
    revision = report_of(result).run
    assert outcome_name(state) == "Revised" and revision.params == {"recipients": ["new@example.com"]}
    assert outbox_recipients(env.ledger, revision.run_id) == ["new@example.com"]
    assert outbox_recipients(env.ledger, original.run_id) == ["a@example.com"]
    state, _ = env.run(probe.name, period=PERIOD)
    assert outcome_name(state) == "Duplicate"


def test_a_job_with_a_business_effect_is_not_revised(env: Env) -> None:
    """A revision would apply the effect a second time: refused, nothing written."""
    applied: list[str] = []

    def effect(session: Session, output: dict[str, Any]) -> None:
        applied.append(output["text"])

    probe = probe_job(effect=effect)
    env.run(probe.name, period=PERIOD)
    original = env.the_run("acme", PERIOD, probe.job)
    state, result = revised(run_id=original.run_id, reason="why")
    assert state.is_failed() and "business effect" in str(result)
    assert len(applied) == 1 and len(env.ledger.revisions(original.run_id)) == 1


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_runledger_runs_revise_runs_the_flow_and_shows_the_lineage(env: Env) -> None:
    """The CLI revises by id prefix, prints JSON, refuses an empty reason; `runs show` lists
    the lineage with reasons and `runs list --json` carries the revision fields."""
    runner = CliRunner()
    assert runner.invoke(app, ["run", SUMMARY, "--subject", "acme", "--period", PERIOD]) \
        .exit_code == 0
    original = env.the_run("acme", PERIOD)
    empty = runner.invoke(app, ["runs", "revise", original.run_id[:10], "--reason", " "])
    assert empty.exit_code == 1 and "--reason" in empty.stderr
    done = runner.invoke(app, ["runs", "revise", original.run_id[:10], "--reason",
                               "summary was wrong", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert (report["outcome"], report["revision"], report["revises_run_id"]) == (
        "new", 1, original.run_id)
    assert outbox_recipients(env.ledger, report["run_id"]) == ACME
    shown = runner.invoke(app, ["runs", "show", original.run_id])
    assert shown.exit_code == 0, shown.output
    assert "revisions (the result is the latest completed)" in shown.stdout
    assert "1 (current result)" in shown.stdout and "summary was wrong" in shown.stdout
    listed = json.loads(runner.invoke(app, ["runs", "list", "--json"]).stdout)
    assert sorted((r["revision"], r["revision_reason"]) for r in listed) == [
        (0, None), (1, "summary was wrong")]


# A worker process per dialect costs ~15 s: the suite kills one on PostgreSQL (the lease and
# claim it relies on are tested on both ledgers), RUNLEDGER_FULL=1 on SQLite too.
KILLED_ON = ["postgres", "sqlite"] if os.environ.get("RUNLEDGER_FULL") == "1" else ["postgres"]


@pytest.mark.parametrize("db_url", KILLED_ON, indirect=True)
def test_a_worker_killed_mid_revision_leaves_it_claimable_and_the_next_attempt_finishes_it(
        env: Env) -> None:
    """SIGKILL after the model's answer: the revision stays running on a lease that expires;
    `runs revise <revision id>` then resumes it and completes it once, with one set of rows."""
    from store import AFTER_MODEL_ANSWER

    runner = CliRunner()
    assert runner.invoke(app, ["run", SUMMARY, "--subject", "acme", "--period", PERIOD]) \
        .exit_code == 0
    original = env.the_run("acme", PERIOD)
    env.set(faults=AFTER_MODEL_ANSWER, lease_seconds=2)
    killed = run_killed(
        [*RUNLEDGER, "runs", "revise", original.run_id, "--reason", "killed", "--json"],
        dict(os.environ), timeout=180)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    env.monkeypatch.delenv("RUNLEDGER_FAULTS")
    [_, revision] = env.ledger.revisions(original.run_id)
    assert revision.status == "running" and env.model_calls() == 2
    with pytest.raises(RevisionInProgress):
        env.ledger.request_revision(original.run_id, "meanwhile")
    wait_until(lambda: lease_expired(env.ledger, revision.run_id), 30, "the dead lease")
    state, _ = revised(run_id=revision.run_id, reason="resume")
    assert outcome_name(state) == "Revised" and env.model_calls() == 3
    assert [a.outcome for a in env.ledger.attempts(revision.run_id)] == ["expired", "completed"]
    assert outbox_recipients(env.ledger, revision.run_id) == ACME


def test_revision_identity_is_the_runs_identity_with_its_number() -> None:
    """The revision's id is derived from the identity and the number (stable across hosts)."""
    from datetime import UTC, datetime

    base = RunIdentity("j", "s", datetime(2026, 1, 5, tzinfo=UTC), "1")
    assert base.revised(3).run_id == RunIdentity("j", "s", base.period_start, "1", 3).run_id


def test_a_revision_of_a_period_not_yet_due_is_refused_unless_allowed(env: Env) -> None:
    """A Run completed early on purpose (allow_not_due) cannot be revised by accident: the
    refusal names the flag and the parameter and writes nothing; allowed, it is revised."""
    probe = probe_job()
    future = "2099-01-05"
    state = final_state(run_job(
        job=probe.name, subjects=["acme"], period=future, allow_not_due=True,
        return_state=True))
    assert outcome_name(state) == "Completed", state.message
    original = env.the_run("acme", future, probe.job)
    state, result = revised(run_id=original.run_id, reason="typo")
    assert state.is_failed() and isinstance(result, PeriodNotDue)
    assert "allow_not_due=true (Custom run)" in str(result)
    assert [r.revision for r in env.ledger.revisions(original.run_id)] in ([], [0])
    state, result = revised(run_id=original.run_id, reason="typo", allow_not_due=True)
    assert outcome_name(state) == "Revised", state.message
