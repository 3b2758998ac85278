"""The alerts a person receives, from a real Prefect server's automation services to a real
webhook on loopback: an overdue or given-up occurrence, and a job whose ticks stopped (the
dead man's switch, which needs nothing but the server)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.events import emit_job_event, emit_occurrence_event
from flows.stack.automations import (
    ALERTS,
    BUDGET_ALERT,
    CRASH_DETECTOR,
    DEAD_MANS_SWITCH,
    dead_mans_switch,
    install,
    install_alerts,
)
from flows.stack.prefect_server import client
from tests.support.alerts import (
    Notification,
    Webhook,
    quiet_job,
    removed_automations,
    webhook_block,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes

DAY = datetime(2026, 3, 2, tzinfo=UTC)


@pytest.fixture(scope="module")
def alerts_api(prefect_api: str) -> Iterator[str]:
    """A temporary Prefect server of this module's own: on the session's, the triggers service
    can lag behind the events of earlier tests (a reconcile test's), past these tests' waits.
    The events worker is restarted on each side, since it keeps the server it first sent to."""
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    EventsWorker.drain_all()
    with prefect_test_harness(server_startup_timeout=90):
        yield str(PREFECT_API_URL.value())
        EventsWorker.drain_all()


def test_an_overdue_or_given_up_occurrence_reaches_the_webhook_naming_job_subject_period_and_why(
        alerts_api: str) -> None:
    """Reconcile's overdue and gave-up events each become one POST through the operator's block,
    whose body says which job, subject and period, and why."""
    job = quiet_job()
    period = job.period_at(DAY)
    run_id = job.identity("acme", period).run_id
    with Webhook() as webhook, webhook_block(alerts_api, webhook, "/alerts") as (_, block_id), \
            removed_automations(alerts_api, ALERTS, BUDGET_ALERT):
        with client(alerts_api) as api:
            assert install_alerts(api, [], block_id, DAY) == [ALERTS, BUDGET_ALERT]
        emit_occurrence_event("overdue", job, subject="acme", period=period, run_id=run_id,
                              state="missed", reason="missed while nothing ran (policy skip)",
                              due_at=job.due_at(period).isoformat())
        emit_occurrence_event("gave-up", job, subject="acme", period=period, run_id=run_id,
                              reason="used 5 of 5 attempts", attempts=5, error="model timed out")
        # The alert matches every job's events: an earlier test's, still reaching the triggers
        # service, notifies too.
        def ours() -> list[Notification]:
            return [n for n in webhook.received("/alerts") if job.name in n.subject]

        overdue, gave_up = wait_until(lambda: sorted(ours(), key=lambda n: "gave-up" in n.subject)
                                      if len(ours()) >= 2 else None, 90, "two notifications")
    where = f"{job.name}/acme/2026-03-02"
    assert overdue.subject == f"runledger overdue: {where}"
    assert f"job {job.name}, subject acme, period 2026-03-02 (version 1)" in overdue.body
    assert "state: missed" in overdue.body
    assert "why: missed while nothing ran (policy skip)" in overdue.body
    assert "due at: 2026-03-02T00:00:00+00:00" in overdue.body and run_id in overdue.body
    assert gave_up.subject == f"runledger gave-up: {where}"
    assert "why: used 5 of 5 attempts" in gave_up.body and "error: model timed out" in gave_up.body
    assert "due at" not in gave_up.body


def test_the_dead_mans_switch_notifies_when_ticks_stop_and_stays_quiet_while_they_arrive(
        alerts_api: str) -> None:
    """With nothing running but the Prefect server, a job without a completed tick for the
    switch's window is notified, window after window; one whose ticks complete in time is not."""
    silent, ticking = quiet_job(), quiet_job()
    window = timedelta(seconds=10)
    names = [DEAD_MANS_SWITCH.format(job=j.name) for j in (silent, ticking)]
    with Webhook() as webhook, webhook_block(alerts_api, webhook, "/switch") as (_, block_id), \
            removed_automations(alerts_api, *names):
        with client(alerts_api) as api:
            for job in (ticking, silent):
                install(api, dead_mans_switch(job, block_id, DAY, within=window))
        started = time.monotonic()

        def two_silent_windows() -> bool:
            emit_job_event("tick.completed", ticking, period="now")
            return len([n for n in webhook.received("/switch") if silent.name in n.subject]) >= 2

        wait_until(two_silent_windows, 120, "two notifications about the silent job", every=2)
        elapsed = time.monotonic() - started
        received = webhook.received("/switch")
    assert elapsed >= 2 * window.total_seconds() - 1
    assert {n.subject for n in received} == {f"runledger: job {silent.name} stopped ticking"}
    assert f"No tick of job {silent.name} completed every subject in the last 10 s" in \
        received[0].body
    assert f"`runledger overdue --job {silent.name}`" in received[0].body


def test_stack_automations_installs_the_alerts_once_for_every_job_through_the_named_block(
        alerts_api: str) -> None:
    """`runledger stack automations --notify-block custom-webhook/NAME` creates the alert and
    one switch per registered job; run again it updates them in place."""
    job = quiet_job(cadence="* * * * *", grace=timedelta(seconds=5))
    cli = CliRunner()
    with Webhook() as webhook, webhook_block(alerts_api, webhook, "/cli") as (name, block_id):
        from flows.registry import registered_jobs

        switches = [DEAD_MANS_SWITCH.format(job=j) for j in registered_jobs()]
        with removed_automations(alerts_api, ALERTS, BUDGET_ALERT, CRASH_DETECTOR, *switches):
            for _ in range(2):
                done = cli.invoke(app, ["stack", "automations", "--notify-block", name],
                                  catch_exceptions=False)
                assert done.exit_code == 0, done.output
            with client(alerts_api) as api:
                installed = {n: api.read_automations_by_name(n)
                             for n in [ALERTS, BUDGET_ALERT, *switches]}
                mine = installed[DEAD_MANS_SWITCH.format(job=job.name)]
    assert all(len(found) == 1 for found in installed.values()), installed
    assert f"the alerts through {name}" in done.output
    [switch] = mine
    assert switch.trigger.within == timedelta(seconds=65)  # type: ignore[union-attr]
    assert switch.actions[0].block_document_id == block_id  # type: ignore[union-attr]


def test_stack_automations_names_a_notification_block_that_does_not_exist(
        alerts_api: str) -> None:
    """An unknown block, in either form, is one clear line and exit status 1, nothing installed."""
    cli = CliRunner()
    for name in ("custom-webhook/nobody", "nobody"):
        done = cli.invoke(app, ["stack", "automations", "--notify-block", name])
        assert done.exit_code == 1
        assert f"no block '{name}' on the Prefect server" in done.output
    with client(alerts_api) as api:
        assert api.read_automations_by_name(ALERTS) == []
