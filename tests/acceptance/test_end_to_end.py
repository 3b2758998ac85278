"""End to end on a real Prefect server (PostgreSQL), the project's deployments applied with
`prefect deploy`, two `prefect worker` processes, the SMTP sink and a PostgreSQL ledger: what a
person sees and does in the Prefect UI, checked through the same API the UI uses.

The tests run in file order on one stack; each uses periods of its own."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

import pytest
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.schedules import SCHEDULE_TYPES, IntervalSchedule
from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

from deployments.project import load_deployments
from flows.jobs.competitor_summary import subscribers, workspaces
from flows.registry import get_job
from flows.run_job.outcomes import outcome_name
from store import Run
from tests.support.pipeline import lease_expired
from tests.support.stack import (
    AcceptanceStack,
    in_seconds,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]

SUMMARY = "competitor-summary"
JOB = get_job(SUMMARY)


def run_id(subject: str, label: str) -> str:
    return JOB.identity(subject, JOB.parse_period(label)).run_id


def recipients(subjects: list[str]) -> list[str]:
    return sorted(r for s in subjects for r in subscribers(s))


def mail_for(stack: AcceptanceStack, label: str) -> list[str]:
    """Recipients of every email received for the period (one entry per email)."""
    return sorted(str(m["To"]) for m in stack.mail() if str(m["Subject"]).endswith(label))


def ledger_runs(stack: AcceptanceStack, label: str) -> list[Run]:
    start = JOB.parse_period(label).start
    ledger = stack.ledger()
    try:
        return [r for r in ledger.runs(job=SUMMARY, limit=1000) if r.period_start == start]
    finally:
        ledger.close()


def outbox_rows(stack: AcceptanceStack, run_ids: list[str]) -> list[str]:
    ledger = stack.ledger()
    try:
        return sorted(m.recipient for r in run_ids for m in ledger.outbox.messages(run_id=r))
    finally:
        ledger.close()


@dataclass(frozen=True)
class Tick:
    """The first, scheduled tick of the reference job, which later tests rerun."""

    flow_run_id: UUID
    final: FlowRun
    label: str
    run_ids: list[str]


@pytest.fixture(scope="module")
def scheduled_tick(stack: AcceptanceStack) -> Tick:
    """A schedule added to the deployment fires a few seconds ahead; its run is waited for,
    then one delivery pass runs."""
    deployment_id = stack.deployment_id(SUMMARY)
    slot = in_seconds(8).replace(microsecond=0)
    with stack.client() as api:
        daily: list[tuple[SCHEDULE_TYPES, bool]] = [(
            IntervalSchedule(interval=timedelta(days=1), anchor_date=slot, timezone="UTC"), True,
        )]
        [schedule] = api.create_deployment_schedules(deployment_id, daily)

        def scheduled() -> UUID | None:
            runs = api.read_flow_runs(deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[deployment_id])))
            hit = [r.id for r in runs if r.expected_start_time == slot and r.auto_scheduled]
            return hit[0] if hit else None

        flow_run_id = wait_until(scheduled, 60, "the scheduler to create the slot's flow run")
        final = stack.wait_final(flow_run_id, timeout=180)
        api.delete_deployment_schedule(deployment_id, schedule.id)
    label = final.name.split("/", 1)[1]
    stack.deliver()
    return Tick(flow_run_id, final, label, [run_id(s, label) for s in workspaces()])


def test_a_scheduled_run_completes_and_delivery_sends_one_email_per_recipient(
        stack: AcceptanceStack, scheduled_tick: Tick) -> None:
    """The slot's flow run ends Completed for the latest period due at the slot, one Run per
    workspace, one model call per Run, and the deliver-outbox deployment sends each subscriber
    exactly one email."""
    run = scheduled_tick.final
    assert run.state is not None and run.state.name == "Completed", run.state
    assert run.auto_scheduled and (run.idempotency_key or "").startswith("scheduled ")
    assert run.expected_start_time is not None
    assert run.name == f"{SUMMARY}/{JOB.latest_due_period(run.expected_start_time).label}"
    runs = ledger_runs(stack, scheduled_tick.label)
    assert sorted(r.run_id for r in runs) == sorted(scheduled_tick.run_ids)
    assert {r.status for r in runs} == {"completed"}
    calls = Counter(c["run_id"] for c in stack.model_calls(set(scheduled_tick.run_ids)))
    assert calls == dict.fromkeys(scheduled_tick.run_ids, 1)
    assert mail_for(stack, scheduled_tick.label) == recipients(workspaces())


def test_prefect_deploy_applied_every_deployment_with_its_schedule_slugs(
        stack: AcceptanceStack) -> None:
    """`prefect deploy --all` created each deployment of prefect.yaml on the process pool, each
    schedule under its slug (so its id survives the next deploy)."""
    for spec in load_deployments():
        with stack.client() as api:
            deployed = api.read_deployment(stack.deployment_id(spec.name))
        assert deployed.work_pool_name == spec.work_pool
        assert deployed.parameters == spec.parameters and set(deployed.tags) == set(spec.tags)
        assert sorted(s.slug or "" for s in deployed.schedules) == sorted(
            s.slug for s in spec.schedules)


OVERLAP_PERIOD = "2026-01-03"
CRASH_PERIOD = "2026-01-04"


@pytest.fixture(scope="module")
def killed_worker(stack: AcceptanceStack) -> UUID:
    """A flow run on worker-a's queue; the moment its model call starts, the worker host dies
    (SIGKILL of the worker and its flow-run process at once) and a replacement worker polling
    the same queues starts. Returns the flow run, which Prefect still shows Running."""
    the_run = run_id("acme", CRASH_PERIOD)
    flow_run_id = stack.run(SUMMARY, {"period": CRASH_PERIOD, "subjects": ["acme"]},
                            queue="worker-a")
    wait_until(lambda: stack.model_calls({the_run}), 120, "the transform to call the model",
               every=0.1)
    infrastructure_pid = stack.flow_run(flow_run_id).infrastructure_pid
    killed = stack.kill_worker("worker-a")
    assert infrastructure_pid is not None and int(infrastructure_pid) in killed
    assert ledger_runs(stack, CRASH_PERIOD)[0].status == "running"
    stack.start_worker("worker-a2", queue_of="worker-a")
    stack.wait_online("worker-a2")
    return flow_run_id


@dataclass(frozen=True)
class SecondWave:
    """Flow runs started together after the first tick (while the crash detector waits for
    the killed flow run): the UI's three ways to rerun the first tick's period, and two runs
    of a new period due at the same second on the two workers."""

    finals: dict[str, FlowRun]
    overlap: list[FlowRun]


@pytest.fixture(scope="module")
def second_wave(stack: AcceptanceStack, scheduled_tick: Tick, killed_worker: UUID) -> SecondWave:
    """"Run", "Custom run" with the period and "Retry" of the finished flow run, while two
    flow runs of another period start at the same moment, one on each worker's own queue."""
    overlap_params = {"period": OVERLAP_PERIOD, "subjects": ["acme"]}
    when = in_seconds(8)
    overlap = [stack.run_at(SUMMARY, when, overlap_params, queue=queue)
               for queue in ("worker-a", "worker-b")]
    quick = stack.run(SUMMARY)
    custom = stack.run(SUMMARY, {"period": scheduled_tick.label})
    stack.retry(scheduled_tick.flow_run_id)
    return SecondWave(
        finals={"run": stack.wait_final(quick), "custom run": stack.wait_final(custom),
                "retry": stack.wait_final(scheduled_tick.flow_run_id, run_count=2)},
        overlap=[stack.wait_final(f) for f in overlap],
    )


def test_run_retry_and_custom_run_of_a_completed_period_end_as_duplicate(
        stack: AcceptanceStack, scheduled_tick: Tick, second_wave: SecondWave) -> None:
    """"Run" on the deployment, "Retry" of the finished flow run (it re-executes) and a
    "Custom run" with the period all end as Duplicate: no new Run, model call or outbox row."""
    finals = second_wave.finals
    assert {what: outcome_name(r.state) for what, r in finals.items() if r.state} == \
        dict.fromkeys(finals, "Duplicate")
    # Re-executed: at least once more (on a loaded machine a starved heartbeat can have the
    # crash detector run it once again; it still ends Duplicate, with nothing new).
    assert finals["retry"].run_count >= 2
    history = stack.state_names(scheduled_tick.flow_run_id)
    assert history.index("Completed") < history.index("AwaitingRetry") < history.index("Cached")
    assert finals["retry"].name == finals["run"].name == finals["custom run"].name
    assert sorted(r.run_id for r in ledger_runs(stack, scheduled_tick.label)) == sorted(
        scheduled_tick.run_ids)
    assert len(stack.model_calls(set(scheduled_tick.run_ids))) == len(scheduled_tick.run_ids)
    assert outbox_rows(stack, scheduled_tick.run_ids) == recipients(workspaces())


def test_two_flow_runs_of_one_period_on_two_workers_call_the_model_once(
        stack: AcceptanceStack, second_wave: SecondWave) -> None:
    """Both flow runs are due at the same second, one on each worker: one completes the Run,
    the other finds it leased (InProgressElsewhere) or completed (Duplicate); one model call."""
    states = sorted(outcome_name(r.state) for r in second_wave.overlap if r.state)
    assert states[0] == "Completed" and states[1] in ("Duplicate", "InProgressElsewhere"), states
    submitters = [stack.submitted_by(run.id) for run in second_wave.overlap]
    assert len(submitters[0]) == len(submitters[1]) == 1 and submitters[0] != submitters[1]
    the_run = run_id("acme", OVERLAP_PERIOD)
    assert len(stack.model_calls({the_run})) == 1
    assert outbox_rows(stack, [the_run]) == recipients(["acme"])


@pytest.fixture(scope="module")
def crash(stack: AcceptanceStack, killed_worker: UUID, second_wave: SecondWave) -> UUID:
    """Once the crash detector has marked the killed flow run Crashed and the dead worker's
    lease has expired: Retry, as in the UI, and wait for the re-execution."""
    the_run = run_id("acme", CRASH_PERIOD)
    wait_until(lambda: stack.flow_run(killed_worker).state_name == "Crashed", 150,
               "the crash detector to mark the flow run Crashed")
    ledger = stack.ledger()
    try:
        wait_until(lambda: lease_expired(ledger, the_run), 60,
                   "the dead worker's lease to expire")
    finally:
        ledger.close()
    stack.retry(killed_worker)
    stack.wait_final(killed_worker, timeout=180, run_count=2)
    return killed_worker


def test_a_worker_killed_mid_transform_leaves_a_crashed_attempt_and_the_run_completes_once(
        stack: AcceptanceStack, crash: UUID) -> None:
    """The flow run shows Crashed, then the retry that Completed; the Run has two attempts
    (the expired one and the completing one) and one outbox row per recipient."""
    final = stack.flow_run(crash)
    assert final.state is not None and final.state.name == "Completed", final.state
    assert final.run_count == 2
    history = stack.state_names(crash)
    assert history.index("Crashed") < history.index("AwaitingRetry") < history.index("Completed")
    the_run = run_id("acme", CRASH_PERIOD)
    [run] = ledger_runs(stack, CRASH_PERIOD)
    assert run.status == "completed" and run.attempts == 2
    ledger = stack.ledger()
    try:
        outcomes = Counter(a.outcome for a in ledger.attempts(the_run))
    finally:
        ledger.close()
    assert outcomes["completed"] == 1 and sum(outcomes.values()) == 2
    assert len(stack.model_calls({the_run})) == 2  # the killed call and the completing one
    assert outbox_rows(stack, [the_run]) == recipients(["acme"])


def test_one_delivery_pass_after_reruns_overlap_and_crash_sends_each_email_once(
        stack: AcceptanceStack, scheduled_tick: Tick, second_wave: SecondWave,
        crash: UUID) -> None:
    """The deliver-outbox deployment sends the new periods' emails and nothing again for the
    rerun period: every recipient has exactly one email per period."""
    assert stack.deliver().state.name == "Completed"  # type: ignore[union-attr]
    assert mail_for(stack, scheduled_tick.label) == recipients(workspaces())
    assert mail_for(stack, OVERLAP_PERIOD) == recipients(["acme"])
    assert mail_for(stack, CRASH_PERIOD) == recipients(["acme"])


def test_flow_runs_task_runs_artifacts_and_events_read_back_through_the_api(
        stack: AcceptanceStack, scheduled_tick: Tick) -> None:
    """What the UI shows: the named flow run with its job tags, one register+claim task run
    for the tick and one task run per stage and subject, the tick artifact naming each Run,
    and the ledger's events."""
    run = stack.flow_run(scheduled_tick.flow_run_id)
    assert run.name == f"{SUMMARY}/{scheduled_tick.label}"
    assert {"runledger", f"job:{SUMMARY}", f"version:{JOB.version}"} <= set(run.tags)
    this_run = FlowRunFilter(id=FlowRunFilterId(any_=[scheduled_tick.flow_run_id]))
    with stack.client() as api:
        task_runs = {t.name for t in api.read_task_runs(flow_run_filter=this_run)}
        artifacts = api.read_artifacts(flow_run_filter=this_run)

        seen: dict[str, Counter[str]] = {}

        def events(name: str) -> Counter[str]:
            """The Runs the flow run's events of that name are about, with how many each."""
            found = api.read_events(EventFilter(
                event=EventNameFilter(name=[name]),
                related=EventRelatedFilter(id=[f"prefect.flow-run.{scheduled_tick.flow_run_id}"]),
            ), limit=50)
            seen[name] = Counter(e.resource.id.removeprefix("runledger.run.")
                                 for e in found.events)
            return seen[name]

        runs = set(scheduled_tick.run_ids)
        try:
            wait_until(lambda: events("runledger.run.completed") == Counter(runs), 60,
                       "the completion events")
            wait_until(lambda: set(events("runledger.run.duplicate")) >= runs, 60,
                       "the retry's duplicate events")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the Runs expected: {sorted(runs)}; the events "
                                 f"found: {seen}") from None
    stages = ("collect", "transform", "persist")
    assert {f"{stage}[{s}]" for stage in stages for s in workspaces()} <= task_runs
    assert f"register+claim[{len(workspaces())} subjects]" in task_runs
    assert f"{SUMMARY}-tick" in {a.key for a in artifacts}
    assert all(r in str([a.data for a in artifacts]) for r in scheduled_tick.run_ids)


CANCEL_PERIOD = "2026-01-05"


@pytest.fixture(scope="module")
def cancelled(stack: AcceptanceStack) -> UUID:
    """A Custom run of every workspace, one at a time (its own job variables); while the first
    workspace's model call is under way, Cancel as in the UI and wait for the flow run to end."""
    first = workspaces()[0]
    flow_run_id = stack.run(SUMMARY, {"period": CANCEL_PERIOD},
                            env={"RUNLEDGER_SUBJECT_CONCURRENCY": "1"})
    wait_until(lambda: stack.model_calls({run_id(first, CANCEL_PERIOD)}), 120,
               "the first workspace's model call", every=0.1)
    stack.cancel(flow_run_id)
    stack.wait_final(flow_run_id, timeout=90)
    return flow_run_id


def test_a_flow_run_cancelled_in_the_ui_calls_no_more_models_and_releases_its_runs_at_once(
        stack: AcceptanceStack, cancelled: UUID) -> None:
    """The flow run shows Cancelled; the model call under way was paid for and its Run is
    completed; the other workspaces were never collected nor sent to the model, and their Runs
    are released (pending, no owner) before the flow-run process ends, not left leased; the
    next run of the period completes only them."""
    final = stack.flow_run(cancelled)
    assert final.state is not None and final.state.name == "Cancelled", final.state
    first, *rest = workspaces()
    ids = {s: run_id(s, CANCEL_PERIOD) for s in workspaces()}
    ledger = stack.ledger()
    try:
        def released() -> bool:
            return all(ledger.get(ids[s]).owner is None for s in workspaces())

        wait_until(released, 40, "the cancelled flow run to release its Runs")
        runs = {s: ledger.get(r) for s, r in ids.items()}
    finally:
        ledger.close()
    assert runs[first].status == "completed"
    for subject in rest:
        run = runs[subject]
        assert (run.status, run.lease_expires_at, run.raw_input) == ("pending", None, None)
        assert run.error is not None and "FlowRunStopped" in run.error, run.error
    assert [c["run_id"] for c in stack.model_calls(set(ids.values()))] == [ids[first]]
    again = stack.wait_final(stack.run(SUMMARY, {"period": CANCEL_PERIOD}))
    assert again.state is not None and again.state.name == "Completed", again.state
    calls = Counter(c["run_id"] for c in stack.model_calls(set(ids.values())))
    assert calls == dict.fromkeys(ids.values(), 1)
    assert outbox_rows(stack, list(ids.values())) == recipients(workspaces())
