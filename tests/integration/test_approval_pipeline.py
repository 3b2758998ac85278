"""A job that asks for approval, through the real run-job and revise flows: its Runs complete as
always (output stored, the model paid once), its messages wait held, a rerun queues nothing
more, and a revision's messages are held under the revision's rules."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from typer.testing import Result

from flows.jobs import Approval
from flows.run_job.outcomes import outcome_name
from flows.run_job.revision import revise
from tests.support.delivery import statuses
from tests.support.pipeline import Env, final_state, probe_job
from tests.support.review import review_deployment, review_flow_runs

PERIOD = "2026-01-05"
OTHER = "2026-01-06"


@pytest.mark.usefixtures("subprocesses_use_the_session_server")
def test_the_reference_job_with_approval_completes_and_holds_every_message(env: Env) -> None:
    """RUNLEDGER_COMPETITOR_SUMMARY_APPROVAL=1: the tick completes each workspace with one
    model call, every email is held with a deadline of RUNLEDGER_APPROVAL_DEADLINE_HOURS, a
    rerun is a duplicate; a resent revision's messages are held too, with their own keys."""
    env.set(competitor_summary_approval=1, approval_deadline_hours=2)
    state, _ = env.run("competitor-summary", period=PERIOD)
    assert state.is_completed(), state.message
    assert env.model_calls() == 2
    assert statuses(env.ledger) == {"held": 3}
    acme = env.the_run("acme", PERIOD)
    assert acme.status == "completed" and acme.output is not None
    for held in env.ledger.outbox.held(run_id=acme.run_id):
        until, created = held.message.hold_until, held.message.created_at
        assert until is not None and created is not None
        assert (until - created).total_seconds() == pytest.approx(7200, abs=1)
    again, _ = env.run("competitor-summary", period=PERIOD)
    assert outcome_name(again) == "Duplicate" and statuses(env.ledger) == {"held": 3}
    revised = final_state(revise(run_id=acme.run_id, reason="wording", return_state=True))
    assert revised.is_completed(), revised.message
    assert statuses(env.ledger) == {"held": 5}
    assert {h.revision for h in env.ledger.outbox.held(job="competitor-summary")} == {0, 1}


def test_without_approval_the_reference_job_queues_its_messages_pending(env: Env) -> None:
    """The default: nothing is held."""
    state, _ = env.run("competitor-summary", period=PERIOD)
    assert state.is_completed(), state.message
    assert statuses(env.ledger) == {"pending": 3}


def test_a_period_of_a_job_is_approved_from_the_command_line(
        env: Env, invoke: Callable[..., Result]) -> None:
    """`outbox approve --job JOB --period P` decides exactly that period's held messages; the
    list labels each Run by its job, subject and period."""
    probe = probe_job(approval=Approval())
    for period in (PERIOD, OTHER):
        state, _ = env.run(probe.name, period=period)
        assert state.is_completed(), state.message
    listed = invoke("outbox", "held", "--job", probe.name, env={"COLUMNS": "200"})
    assert f"{probe.name} acme {PERIOD}" in listed.stdout
    done = invoke("outbox", "approve", "--job", probe.name, "--period", PERIOD, "--by", "erin")
    assert done.exit_code == 0, done.stderr
    assert "approved 2 message(s) by erin" in done.stdout
    left = env.ledger.outbox.held(job=probe.name)
    assert len(left) == 2 and all(h.period_start.date().isoformat() == OTHER for h in left)


@pytest.mark.usefixtures("subprocesses_use_the_session_server")
def test_a_tick_that_held_messages_starts_one_review_flow_run_for_its_period(env: Env) -> None:
    """With a review-outbox deployment on the server, the tick creates one flow run of it with
    the job and period as parameters; a rerun of the same flow run would not add another (its
    idempotency key is the tick's flow run)."""
    asyncio.run(review_deployment())
    probe = probe_job(approval=Approval())
    state, _ = env.run(probe.name, period=PERIOD)
    assert state.is_completed(), state.message
    runs = [r for r in asyncio.run(review_flow_runs())
            if r.parameters.get("job") == probe.name]
    assert [r.parameters for r in runs] == [{"job": probe.name, "period": PERIOD}]
