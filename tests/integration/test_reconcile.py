"""Reconcile on both ledgers with a real Prefect server, time under the test's control: a week
replayed with three days of downtime for each missed-run policy, a subject added mid-week, the
cap, stranded Runs re-driven or given up, overdue and recovered reported once, and a stale
scheduled tick of a skip job that runs nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from flows.events import emit_decisions
from flows.jobs import Job, TransientError
from flows.reconcile.flow import JobReconciled, reconcile_jobs
from flows.reconcile.flow import reconcile as reconcile_flow
from flows.run_job.flow import run_ledgered_tick
from flows.run_job.outcomes import TickReport
from flows.run_job.stop import Stop
from flows.settings import RunledgerSettings
from store import RunIdentity, unemitted
from tests.support.ledger import register_and_claim
from tests.support.pipeline import (
    Env,
    final_state,
    outcomes,
    pipeline_env,
    probe_job,
    status_boards,
    wait_until,
)

MONDAY = datetime(2026, 1, 5, tzinfo=UTC)


@pytest.fixture
def env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_api: str) -> Iterator[Env]:
    """A fresh ledger, a model call log, fast retries and no re-drive backoff."""
    with pipeline_env(db_url, tmp_path, monkeypatch) as found:
        found.set(reconcile_backoff_seconds=0)
        yield found


def at(day: int, hour: int = 10) -> datetime:
    """A moment of the replayed week: ``day`` days after Monday 5 January 2026."""
    return MONDAY + timedelta(days=day, hours=hour)


def reconcile(job: Job, now: datetime, **settings: Any) -> JobReconciled:
    [done] = asyncio.run(reconcile_jobs([job], now=now, settings=RunledgerSettings(**settings)))
    return done


def completed_periods(env: Env, job: Job, subject: str = "acme") -> list[str]:
    runs = [r for r in env.ledger.runs(job=job.name, limit=1000) if r.subject == subject]
    return sorted(job.period_at(r.period_start).label for r in runs if r.status == "completed")


def events(name: str, identities: list[RunIdentity]) -> int:
    """How many ``name`` events the Prefect server holds for these occurrences."""
    with get_client(sync_client=True) as client:
        return len(client.read_events(EventFilter(
            event=EventNameFilter(name=[name]),
            resource=EventResourceFilter(id=[f"runledger.run.{i.run_id}" for i in identities]),
        ), limit=50).events)


def test_catch_up_runs_every_missed_day_once_oldest_first(env: Env) -> None:
    """Monday runs; nothing runs Tuesday to Thursday; Friday's pass completes Tuesday to
    Friday once each (one model call each), reports each late day overdue then recovered
    once, and a second pass at the same moment does nothing."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="catch-up", start=MONDAY)
    first = reconcile(probe.job, at(0))
    assert [t.period.label for t in first.ticks] == ["2026-01-05"]
    friday = reconcile(probe.job, at(4))
    assert sorted(t.period.label for t in friday.ticks) == [
        "2026-01-06", "2026-01-07", "2026-01-08", "2026-01-09"]
    assert completed_periods(env, probe.job) == [
        "2026-01-05", "2026-01-06", "2026-01-07", "2026-01-08", "2026-01-09"]
    assert env.model_calls() == 5
    assert len(friday.overdue) == 4 and len(friday.recovered) == 4
    again = reconcile(probe.job, at(4))
    assert again.ticks == [] and again.overdue == [] and again.recovered == []
    assert env.model_calls() == 5
    late = [probe.job.identity("acme", probe.job.period_at(at(d))) for d in range(1, 5)]
    wait_until(lambda: events("runledger.run.recovered", late) == 4, 30, "the recovered events")
    assert events("runledger.run.overdue", late) == 4


def test_a_job_that_ran_before_reconcile_first_looked_is_owed_from_its_first_run(
        env: Env) -> None:
    """No start and no reconcile until Friday, but a tick ran on Monday: Friday's first pass
    owes acme from Monday and catches up Tuesday to Friday, instead of owing from Friday."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="catch-up")
    env.run(probe.name, period="2026-01-05")
    friday = reconcile(probe.job, at(4))
    assert sorted(t.period.label for t in friday.ticks) == [
        "2026-01-06", "2026-01-07", "2026-01-08", "2026-01-09"]
    assert env.ledger.occurrences.obligations(probe.job.name) == {"acme": MONDAY}
    assert env.model_calls() == 5


def test_skip_records_the_missed_days_skipped_and_a_custom_run_still_runs_one(env: Env) -> None:
    """With skip, Friday's pass runs nothing for Tuesday to Thursday, records them skipped
    (an event each) and is not late for Friday itself; running Wednesday on purpose works."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="skip", start=MONDAY,
                      due=timedelta(hours=9))
    env.run(probe.name, period="2026-01-05")  # Monday's scheduled tick
    friday = reconcile(probe.job, at(4, hour=9) + timedelta(minutes=30))
    skipped = [probe.job.identity("acme", probe.job.period_at(at(d))) for d in range(1, 4)]
    assert sorted(friday.skipped) == sorted(i.run_id for i in skipped)
    assert friday.ticks == [] and env.model_calls() == 1
    reasons = {o.skip_reason for o in env.ledger.occurrences.list(probe.job.name, MONDAY)}
    assert reasons == {"missed while nothing ran; policy skip"}
    assert [s.state for s in friday.plan.steps][-1] == "upcoming"  # Friday's slot is not late
    _, report = env.run(probe.name, period="2026-01-07")
    assert outcomes(report) == {"acme": "new"}
    wait_until(lambda: events("runledger.run.skipped", skipped) == 3, 30, "the skipped events")


def test_latest_runs_only_the_most_recent_day_and_skips_the_older_as_superseded(
        env: Env) -> None:
    """With latest, Friday's pass runs Friday and records Tuesday to Thursday superseded."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="latest", start=MONDAY)
    reconcile(probe.job, at(0))
    friday = reconcile(probe.job, at(4))
    assert [t.period.label for t in friday.ticks] == ["2026-01-09"]
    assert len(friday.skipped) == 3
    reasons = {o.skip_reason for o in env.ledger.occurrences.list(probe.job.name, MONDAY)
               if o.skipped_at is not None}
    assert reasons == {"superseded by 2026-01-09"}
    assert completed_periods(env, probe.job) == ["2026-01-05", "2026-01-09"]


def test_a_subject_added_mid_week_is_owed_only_from_when_reconcile_first_saw_it(
        env: Env) -> None:
    """globex joins on Wednesday: Friday's catch-up completes acme's missed days and only
    globex's Friday, never its Monday to Thursday."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="catch-up", start=MONDAY)
    reconcile(probe.job, at(0))
    assert isinstance(probe.job.subjects, list)
    probe.job.subjects.append("globex")
    reconcile(probe.job, at(4))
    assert completed_periods(env, probe.job, "globex") == ["2026-01-09"]
    assert len(completed_periods(env, probe.job, "acme")) == 5


def test_the_cap_leaves_the_newest_occurrences_for_the_next_pass(env: Env) -> None:
    """With a cap of 3, Friday's pass runs the three oldest owed days and says how many it
    left; the next pass finishes the rest."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="catch-up", start=MONDAY)
    first = reconcile(probe.job, at(4), reconcile_cap=3)
    assert first.plan.capped == 2 and "2 left for the next pass" in first.summary()
    assert completed_periods(env, probe.job) == ["2026-01-05", "2026-01-06", "2026-01-07"]
    reconcile(probe.job, at(4), reconcile_cap=3)
    assert len(completed_periods(env, probe.job)) == 5


def test_a_stranded_run_is_re_driven_and_finished_once(env: Env) -> None:
    """A Run claimed and left on an expired lease (its worker died after saving the input)
    is completed by the next pass with its stored input: one collect was never repeated."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="skip")
    today = probe.job.period_at(env.ledger.now())
    identity = probe.job.identity("acme", today)
    claim = register_and_claim(env.ledger, identity, probe.job.run_params("acme", today),
                               owner="dead:1", lease=0.001).claim
    assert claim is not None
    env.ledger.save_input(claim, {"subject": "acme", "text": "News about acme."})
    wait_until(lambda: env.ledger.occurrences.run_states(probe.job.name, today.start)[0].stranded, 10,
               "the lease to expire")
    done = reconcile(probe.job, env.ledger.now())
    assert [s.action for s in done.plan.steps] == ["redrive"]
    assert env.ledger.get(identity.run_id).status == "completed"
    assert probe.collects == [] and env.model_calls() == 1


def test_a_run_failing_transiently_every_time_is_given_up_once_at_its_cap(env: Env) -> None:
    """Every attempt times out: each pass re-drives it until its third attempt, then the next
    pass fails it for good with the give-up event once, and later passes leave it failed."""
    # No lateness allowed: today's occurrence is missed at once, whatever the hour.
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="catch-up", max_attempts=3,
                      transform_errors=[TransientError("timed out")] * 20,
                      max_lateness=timedelta(0))
    env.set(task_retries=0)
    identity = probe.job.identity("acme", probe.job.period_at(env.ledger.now()))
    for _ in range(3):
        reconcile(probe.job, env.ledger.now())
    assert env.ledger.get(identity.run_id).attempts == 3
    final = reconcile(probe.job, env.ledger.now())
    assert final.gave_up == [identity.run_id]
    run = env.ledger.get(identity.run_id)
    assert run.status == "failed" and run.error is not None
    assert run.error.startswith("gave up after 3 attempts: TransientError: timed out")
    later = reconcile(probe.job, env.ledger.now())
    assert later.gave_up == [] and later.ticks == []
    wait_until(lambda: events("runledger.run.gave-up", [identity]) == 1, 30, "the give-up event")


def test_a_stale_scheduled_tick_of_a_skip_job_runs_nothing_and_ends_skipped(env: Env) -> None:
    """A scheduled tick of Monday starting on Friday: no stage runs, no model call, each
    occurrence is recorded skipped with how to run it anyway; Monday run on purpose works."""
    probe = probe_job(["acme", "globex"], ["ops@example.com"], missed_runs="skip")
    monday = probe.job.period_at(at(0))
    identities = {s: probe.job.identity(s, monday) for s in ("acme", "globex")}
    ticked = run_ledgered_tick(probe.job, monday, identities, RunledgerSettings(), "test",
                               Stop(), expected_start=probe.job.due_at(monday))
    assert ticked.kind == "ran", ticked
    report, _ = ticked.ran()
    assert isinstance(report, TickReport) and report.state_name() == "Skipped"
    assert set(outcomes(report).values()) == {"skipped"}
    assert "period=2026-01-05" in (report.subjects[0].error or "")
    assert env.model_calls() == 0 and probe.collects == []
    assert {o.run_id for o in env.ledger.occurrences.list(probe.job.name, MONDAY)} == {
        i.run_id for i in identities.values()}
    # Each skip's event went out as the decision's (recorded emitted: reconcile will not again).
    assert not any(unemitted(o) for o in env.ledger.occurrences.list(probe.job.name, MONDAY))
    wait_until(lambda: events("runledger.run.skipped", list(identities.values())) == 2, 30,
               "the skipped events")
    _, rerun = env.run(probe.name, period="2026-01-05")
    assert outcomes(rerun) == {"acme": "new", "globex": "new"}


def test_a_reconcile_flow_run_refreshes_each_jobs_status_board_artifact(env: Env) -> None:
    """After a pass, ``runledger-status-<job>`` shows what the pass decided: a skip job down for
    two days and today has every owed period skipped by its policy."""
    now = env.ledger.now()
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="skip",
                      start=now - timedelta(days=2), grace=timedelta(0),
                      max_lateness=timedelta(0))
    state = final_state(reconcile_flow(job=probe.name, return_state=True))
    assert state.is_completed(), state.message
    [board, *_] = status_boards(probe.name)
    assert len(board) == 3 and all((r["owed"], r["skipped"]) == (1, 1) for r in board)


def test_decisions_whose_events_the_prefect_api_did_not_take_stay_to_be_emitted(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """With the Prefect API unreachable, an overdue report's event is not recorded emitted: the
    pass warns and goes on, and the decision stays leased for a later pass to emit."""
    probe = probe_job(["acme"], ["ops@example.com"], missed_runs="catch-up", start=MONDAY)
    late = probe.job.identity("acme", probe.job.period_at(at(0)))
    env.ledger.occurrences.mark_overdue([late])
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api",
                             PREFECT_CLIENT_MAX_RETRIES: 0}):
        emit_decisions(env.ledger, probe.job, {})
    [occurrence] = env.ledger.occurrences.list(probe.job.name, MONDAY)
    assert [kind for kind, _ in unemitted(occurrence)] == ["overdue"]
    assert occurrence.emitting_until is not None
    assert f"could not emit 1 decision events of {probe.job.name}" in caplog.text
