"""The run-job flow on a real Prefect server (the session's test harness) and real ledgers
(SQLite and PostgreSQL): duplicates, overlaps, retries, failures and bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, State
from prefect.context import FlowRunContext
from prefect.deployments.runner import RunnerDeployment
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.flow_engine import run_flow
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Scheduled
from prefect.utilities.collections import visit_collection

from bench.loopback import Answer, LoopbackServer, Request, json_answer
from flows.board import Board
from flows.errors import PeriodNotDue
from flows.jobs.competitor_summary import job as competitor_summary
from flows.model import OfflineModel
from flows.prices import NO_PRICES
from flows.registry import register
from flows.run_job.flow import run_job
from flows.run_job.monitoring import after_tick, create_status_artifact, label_flow_run
from flows.run_job.outcomes import TickReport, outcome_name
from flows.run_job.tasks import register_and_claim
from flows.run_job.tick import Tick
from flows.settings import RunledgerSettings
from flows.spend import spend_of
from flows.stats import daily_stats
from store import Intent, Ledger, Registration, Run
from tests.support.alerts import quiet_job
from tests.support.ledger import wait_for_db_clock, write_locked
from tests.support.pipeline import (
    ACME,
    SUMMARY,
    Env,
    ModelServer,
    Probe,
    Reply,
    final_state,
    outbox_recipients,
    outcomes,
    pipeline_env,
    probe_job,
    status_boards,
    wait_until,
)
from tests.support.sql_trace import sent_statements

# Behaviour that does not depend on the ledger's dialect runs on the production one only.
postgres_only = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

# The reference job, but catching up: the scheduled slots of the period-mapping test are long
# past, and a skip or latest job would skip them.
CATCHING_UP = dataclasses.replace(competitor_summary, name="summary-catching-up",
                                  missed_runs="catch-up")


def test_the_same_logical_run_twice_keeps_the_first_output_and_calls_the_model_once(
        env: Env, model_server: ModelServer) -> None:
    """The model would answer differently the second time; the first answer stays."""
    first, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    second, again = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert (outcome_name(first), outcome_name(second)) == ("Completed", "Duplicate")
    assert outcomes(again) == {"acme": "duplicate"}
    run = env.the_run("acme", "2026-01-05")
    assert run.output is not None and run.output["text"] == "answer 1"
    assert isinstance(again, TickReport) and again.subjects[0].output == run.output
    assert len(env.ledger.runs(job=SUMMARY)) == 1
    assert outbox_recipients(env.ledger, run.run_id) == ACME
    assert len(model_server.requests) == 1 and env.model_calls() == 1


def test_two_flow_runs_of_the_same_period_at_once_call_the_model_once(env: Env) -> None:
    """Whichever flow run comes second finds the Run leased (or, if it started late on a busy
    machine, already completed) and stops without a model call."""
    env.set(offline_model_delay_seconds=2)
    results: list[tuple[State[Any], Any]] = []
    threads = [threading.Thread(target=lambda: results.append(env.run(SUMMARY, ["acme"],
                                                                      "2026-01-05")))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    states = sorted(outcome_name(state) for state, _ in results)
    assert states in (["Completed", "InProgressElsewhere"], ["Completed", "Duplicate"])
    assert sorted(outcomes(r)["acme"] for _, r in results) in (
        ["in-progress-elsewhere", "new"], ["duplicate", "new"])
    assert env.model_calls() == 1
    run = env.the_run("acme", "2026-01-05")
    assert run.status == "completed" and run.attempts == 1
    assert outbox_recipients(env.ledger, run.run_id) == ACME


def run_to_state(flow_run: FlowRun) -> State[Any]:
    """run_job run in this process for a flow run the server made, to its final state."""
    return final_state(cast("Awaitable[State[Any]]",
                            run_flow(run_job, flow_run=flow_run, return_type="state")))


def test_retried_and_new_flow_runs_of_a_period_map_to_its_run_and_a_custom_period_does_not(
        env: Env) -> None:
    """A flow run set back to Scheduled (the UI's Retry) keeps its expected start time, a new
    run of the deployment later that day is the same period, `period=` picks another day."""
    job = register(CATCHING_UP)
    runner = run_job.to_deployment(name="pipeline-test")
    assert isinstance(runner, RunnerDeployment), runner  # made from sync code: not a coroutine
    deployment = runner.apply()
    assert isinstance(deployment, UUID), deployment
    slot = datetime(2026, 1, 5, 7, tzinfo=UTC)  # 08:00 in Paris
    params = {"job": job.name, "subjects": ["acme"]}
    with get_client(sync_client=True) as client:
        scheduled = client.create_flow_run_from_deployment(
            deployment, parameters=params, state=Scheduled(scheduled_time=slot))
        first = run_to_state(scheduled)
        client.set_flow_run_state(scheduled.id, Scheduled(scheduled_time=datetime.now(UTC)),
                                  force=True)
        retried = run_to_state(client.read_flow_run(scheduled.id))
        later = client.create_flow_run_from_deployment(
            deployment, parameters=params,
            state=Scheduled(scheduled_time=slot + timedelta(hours=14)))  # 22:00 in Paris
        same_day = run_to_state(later)
        custom = client.create_flow_run_from_deployment(
            deployment, parameters={**params, "period": "2026-01-06"})
        other_day = run_to_state(custom)
        names = [client.read_flow_run(f.id).name for f in (scheduled, later, custom)]
        tags = set(client.read_flow_run(scheduled.id).tags)
    assert [outcome_name(s) for s in (first, retried, same_day, other_day)] == [
        "Completed", "Duplicate", "Duplicate", "Completed"]
    ids = [s.result().subjects[0].run_id for s in (first, retried, same_day, other_day)]
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert names == [f"{job.name}/2026-01-05", f"{job.name}/2026-01-05", f"{job.name}/2026-01-06"]
    assert {f"job:{job.name}", "version:1"} <= tags
    assert env.model_calls() == 2


def test_a_timeout_after_collect_is_retried_on_the_stored_raw_input(env: Env) -> None:
    """Prefect retries the transform; a later flow run reuses the stored input: collect ran once."""
    env.set(task_retries=1)
    probe = probe_job(transform_errors=[TimeoutError("model slow"), TimeoutError("model slow")])
    first, report = env.run(probe.name, period="2026-01-05")
    assert first.is_failed() and outcomes(report) == {"acme": "failed"}
    run_id = probe.job.identity("acme", probe.job.parse_period("2026-01-05")).run_id
    pending = env.ledger.get(run_id)
    assert pending.status == "pending" and pending.raw_input is not None
    assert "model slow" in (pending.error or "")
    second, report = env.run(probe.name, period="2026-01-05")
    assert second.name == "Completed" and outcomes(report) == {"acme": "new"}
    assert probe.collects == ["acme"] and probe.transforms == ["acme"] * 3
    assert env.ledger.get(run_id).attempts == 2


def test_a_failed_run_is_retried_without_duplicating_outbox_rows(
        env: Env, model_server: ModelServer) -> None:
    """A 500 leaves the Run pending; the next flow run completes it with one row per recipient."""
    env.set(task_retries=0)
    model_server.script.append(Reply(500))
    first, report = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert first.is_failed() and "HTTP 500" in (first.message or "")
    assert outcomes(report) == {"acme": "failed"}
    run = env.the_run("acme", "2026-01-05")
    assert run.status == "pending" and env.ledger.outbox.messages(run_id=run.run_id) == []
    second, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    third, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert (outcome_name(second), outcome_name(third)) == ("Completed", "Duplicate")
    assert outbox_recipients(env.ledger, run.run_id) == ACME
    assert env.the_run("acme", "2026-01-05").attempts == 2


@postgres_only
def test_transient_model_errors_are_retried_with_backoff_in_the_same_attempt(
        env: Env, model_server: ModelServer) -> None:
    """500 then 429 with Retry-After, then an answer: one flow run, one claim, three calls."""
    model_server.script.extend([Reply(500), Reply(429, headers={"Retry-After": "0.2"})])
    state, report = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert state.name == "Completed" and outcomes(report) == {"acme": "new"}
    assert len(model_server.requests) == 3
    run = env.the_run("acme", "2026-01-05")
    assert run.attempts == 1 and run.output is not None and run.output["text"] == "answer 3"


@postgres_only
def test_a_permanent_failure_is_not_retried_until_an_operator_requeues_it(
        env: Env, model_server: ModelServer) -> None:
    """A 400 fails the Run at once (no task retry); reruns say so without calling the model."""
    model_server.script.append(Reply(400))
    first, report = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert first.is_failed() and outcomes(report) == {"acme": "failed"}
    assert len(model_server.requests) == 1
    run = env.the_run("acme", "2026-01-05")
    assert run.status == "failed" and "HTTP 400" in (run.error or "")
    again, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert again.is_failed() and "requeue" in (again.message or "")
    assert len(model_server.requests) == 1
    env.ledger.requeue_run(run.run_id)
    fixed, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert fixed.name == "Completed" and len(model_server.requests) == 2


@postgres_only
def test_an_invalid_candidate_fails_the_run_without_retry(
        env: Env, model_server: ModelServer) -> None:
    """An empty summary fails validation: the Run is failed, nothing is queued, no retry."""
    model_server.script.append(Reply(text='{"summary": "   ", "launches": []}'))
    state, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert state.is_failed() and "empty summary" in (state.message or "")
    run = env.the_run("acme", "2026-01-05")
    assert run.status == "failed" and env.ledger.outbox.messages(run_id=run.run_id) == []
    assert len(model_server.requests) == 1


@postgres_only
@pytest.mark.parametrize(("job", "subjects", "period", "message"), [
    ("no-such-job", None, "2026-01-05", "unknown job 'no-such-job'; registered jobs: "),
    (SUMMARY, None, "2026-13-45", "is not a date \\(YYYY-MM-DD\\)"),
    (SUMMARY, None, "2026-01-05T09:00:00", "naive datetime"),
    (SUMMARY, ["initech"], "2026-01-05", "no subject 'initech'; known subjects: acme, globex"),
])
def test_bad_input_fails_the_flow_run_with_a_clear_message_and_writes_nothing(
        env: Env, job: str, subjects: list[str] | None, period: str, message: str) -> None:
    """Unknown job, malformed period, naive datetime, unknown subject: no Run is created, and
    the flow run's name says its input was refused."""
    state, error = env.run(job, subjects, period)
    assert state.is_failed()
    assert isinstance(error, Exception)
    assert env.ledger.runs() == []
    assert re.search(message, state.message or ""), state.message
    with get_client(sync_client=True) as client:
        assert state.state_details.flow_run_id is not None
        assert client.read_flow_run(state.state_details.flow_run_id).name == f"{job}/invalid-input"


class RefusingApi(LoopbackServer):
    """A Prefect API that answers every call with a server error."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Request] = []

    def answer(self, request: Request) -> Answer:
        self.requests.append(request)
        return json_answer(500, {"detail": "Internal Server Error"})


def test_a_refused_naming_call_is_logged_and_leaves_the_flow_run_completed(
        prefect_api: str, caplog: pytest.LogCaptureFixture) -> None:
    """Name and tags are monitoring: a server error on that call must not turn a tick the
    ledger completed into a failed (paging) flow run."""
    with RefusingApi() as refusing:

        @flow
        async def labelled() -> str:
            # In an event loop of its own: the flow run's client, bound to this loop and to the
            # real server, would otherwise be reused whatever the API URL says.
            with temporary_settings({PREFECT_API_URL: f"{refusing.origin}/api"}):
                await asyncio.to_thread(asyncio.run, label_flow_run("probe/2026-01-05", None))
            return "tick done"

        state = final_state(labelled(return_state=True))
    assert state.is_completed() and state.result() == "tick done"
    assert refusing.requests, "the naming call never reached the refusing server"
    assert any(r.levelname == "WARNING" and "could not name the flow run 'probe/2026-01-05'"
               in r.getMessage() for r in caplog.records), caplog.text


def test_changed_recipients_under_the_same_run_are_a_conflict(env: Env) -> None:
    """Other subscribers for the same day fail clearly; the Run and its outbox stay as they were."""
    first, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert first.name == "Completed"
    subscribers = env.source / "acme" / "subscribers.txt"
    subscribers.write_text(subscribers.read_text() + "intern@acme.example\n")
    second, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert second.is_failed() and "different parameters" in (second.message or "")
    run = env.the_run("acme", "2026-01-05")
    assert outbox_recipients(env.ledger, run.run_id) == ACME
    assert env.model_calls() == 1


def test_a_rerun_of_a_completed_tick_starts_no_task_runs_and_calls_no_model(env: Env) -> None:
    """Every Run is read in one batch; completed ones get no task run, only an event each."""
    probe = probe_job([f"s{i:02d}" for i in range(12)], ["ops@example.com"])
    first, _ = env.run(probe.name, period="2026-01-05")
    second, report = env.run(probe.name, period="2026-01-05")
    assert (outcome_name(first), outcome_name(second)) == ("Completed", "Duplicate")
    assert set(outcomes(report).values()) == {"duplicate"}
    assert env.model_calls() == 12 and len(probe.collects) == 12
    run_ids = [s.run_id for s in report.subjects] if isinstance(report, TickReport) else []
    with get_client(sync_client=True) as client:
        def task_runs(state: State[Any]) -> int:
            return len(client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))))

        wait_until(lambda: task_runs(first) == 12 * 3 + 1, 120, "the first tick's task runs")
        wait_until(lambda: run_events("runledger.run.duplicate", run_ids) == 12, 30,
                   "the duplicate events")
        assert run_events("runledger.run.completed", run_ids) == 12
        assert task_runs(second) == 0
        artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[second.state_details.flow_run_id])))
    by_key = {str(a.key): a for a in artifacts}
    assert sorted(by_key) == [f"{probe.name}-tick", f"runledger-status-{probe.name}"]
    assert all(run_id in str(by_key[f"{probe.name}-tick"].data) for run_id in run_ids)


def test_a_rerun_of_a_completed_tick_asks_the_ledger_for_no_raw_input(env: Env) -> None:
    """A tick's raw inputs can be large (every subject's documents) and a rerun of a completed
    tick needs none of them: its batched read names outputs, not the raw_input column."""
    probe = probe_job(["s0", "s1", "s2"], ["ops@example.com"])
    first, _ = env.run(probe.name, period="2026-01-05")
    with sent_statements() as statements:  # the flow opens its own ledger
        second, report = env.run(probe.name, period="2026-01-05")
    assert (outcome_name(first), outcome_name(second)) == ("Completed", "Duplicate")
    assert outcomes(report) == dict.fromkeys(["s0", "s1", "s2"], "duplicate")
    # The status board read after the tick (read_run_states) names neither column.
    read = [s for s in statements if "FROM runs" in s]
    assert any("runs.output" in s for s in read), read
    assert all("raw_input" not in s for s in read), read


def run_events(name: str, run_ids: list[str]) -> int:
    """How many ``name`` events the Prefect server holds for these Runs."""
    with get_client(sync_client=True) as client:
        return len(client.read_events(EventFilter(
            event=EventNameFilter(name=[name]),
            resource=EventResourceFilter(id=[f"runledger.run.{i}" for i in run_ids]),
        ), limit=50).events)


def test_a_tick_registers_and_claims_all_its_unfinished_subjects_in_one_task_run(
        env: Env) -> None:
    """Of five subjects, one already completed: one register+claim task run for the other four,
    then collect, transform and persist for each of them, and nothing for the completed one."""
    probe = probe_job([f"s{i}" for i in range(5)], ["ops@example.com"])
    done, _ = env.run(probe.name, ["s0"], period="2026-01-05")
    state, report = env.run(probe.name, period="2026-01-05")
    assert (done.name, state.name) == ("Completed", "Completed")
    assert outcomes(report) == {"s0": "duplicate", **{f"s{i}": "new" for i in range(1, 5)}}
    assert sorted(probe.transforms) == [f"s{i}" for i in range(5)]
    with get_client(sync_client=True) as client:
        def task_runs() -> list[Any]:
            return client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))

        wait_until(lambda: len(task_runs()) == 4 * 3 + 1, 120, "the tick's task runs")
        wait_until(lambda: all(t.state is not None and t.state.is_final() for t in task_runs()),
                   30, "the task runs' final states")
        runs = task_runs()
    claims = [t for t in runs if t.name.startswith("register+claim")]
    assert [t.name for t in claims] == ["register+claim[4 subjects]"]
    assert claims[0].state is not None and claims[0].state.name == "Completed"
    assert claims[0].state.message == (
        "4 claimed, 0 duplicate, 0 in progress elsewhere, 0 conflict, 0 failed")
    assert sorted(t.name for t in runs if t not in claims) == sorted(
        f"{stage}[s{i}]" for stage in ("collect", "transform", "persist") for i in range(1, 5))


def test_a_large_tick_claims_a_batch_at_a_time_and_holds_no_more_runs_than_one_batch(
        env: Env) -> None:
    """Seven subjects in batches of three: three register+claim task runs, and no subject is
    collected while more than one batch's Runs are leased (the next batch waits for this one)."""
    env.set(claim_batch=3)
    held: list[int] = []

    def count_running(subject: str) -> None:
        held.append(len(env.ledger.runs(job=probe.name, status="running")))

    probe = probe_job([f"s{i}" for i in range(7)], ["ops@example.com"], on_collect=count_running)
    state, report = env.run(probe.name, period="2026-01-05")
    assert state.name == "Completed" and outcomes(report) == {f"s{i}": "new" for i in range(7)}
    assert len(held) == 7 and max(held) <= 3, held
    with get_client(sync_client=True) as client:
        def claims() -> list[str]:
            return sorted(t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
                if t.name.startswith("register+claim"))

        wait_until(lambda: len(claims()) == 3, 120, "the tick's register+claim task runs")
        assert claims() == ["register+claim[1 subjects]"] + ["register+claim[3 subjects]"] * 2


def test_a_tick_keeps_no_task_result_links_of_the_subjects_it_finished(env: Env) -> None:
    """Prefect links each task result to its State in the flow run context until the flow run
    ends; a subject's stages see only their own links, so a tick's links do not grow with its
    subjects."""
    seen: list[int] = []

    def count_links(subject: str) -> None:
        context = FlowRunContext.get()
        assert context is not None
        seen.append(len(context.run_results))

    probe = probe_job([f"s{i:02d}" for i in range(12)], ["ops@example.com"],
                      on_collect=count_links)
    state, _ = env.run(probe.name, period="2026-01-05")
    assert state.name == "Completed"
    assert seen == [0] * 12


def test_prefect_finds_nothing_to_walk_in_the_registrations_register_and_claim_returns(
        env: Env) -> None:
    """Prefect walks a task's return value looking for futures (every dict, every dataclass
    field); a tick's registrations carry every Run, so the stage must hand them back as one
    leaf however many subjects the tick has."""
    probe = probe_job([f"s{i}" for i in range(50)])
    period = probe.job.parse_period("2026-01-05")
    tick = Tick(probe.job, period, env.ledger, OfflineModel(), NO_PRICES, None, RunledgerSettings(),
                "flow-run")
    state = register_and_claim.fn(tick, {s: probe.job.identity(s, period)
                                         for s in probe.job.subject_names()})
    registrations = state.data
    assert isinstance(registrations, Mapping), registrations  # a mappingproxy: one leaf
    assert set(registrations) == {f"s{i}" for i in range(50)}
    assert all(r.claim is not None for r in registrations.values())
    visited: list[Any] = []
    visit_collection(state, visit_fn=visited.append, return_data=False)
    assert any(v is registrations for v in visited)
    assert not any(isinstance(v, Registration | Run | dict) for v in visited)


class WriteLock:
    """Another session holding the ledger's write lock for a second (``write_locked``)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.taken = threading.Event()
        self.released = threading.Event()

    def hold_for_a_second(self) -> None:
        held = ExitStack()
        held.enter_context(write_locked(self.db_url))

        def end() -> None:
            held.close()
            self.released.set()

        self.taken.set()
        threading.Timer(1.0, end).start()


def test_sixteen_subject_threads_writing_at_once_take_turns_for_the_ledgers_connections(
        env: Env, db_url: str) -> None:
    """RUNLEDGER_SUBJECT_CONCURRENCY=16: the sixteen subjects finish collecting together and
    store their raw input while another session holds the write lock for a second, so sixteen
    ledger writes wait at once: more than the ledger keeps connections (10) and than its pool
    holds (15). They take turns and every subject completes; before 16c9bae the 16th waited
    30 s in the pool for a connection that never came back, and its subject failed."""
    subjects = [f"s{i:02d}" for i in range(16)]
    env.set(subject_concurrency=len(subjects))
    lock = WriteLock(db_url)
    together = threading.Barrier(len(subjects), action=lock.hold_for_a_second, timeout=60)

    def meet(_: str) -> None:
        together.wait()
    probe = probe_job(subjects, ["ops@example.com"], on_collect=meet)
    state, report = env.run(probe.name, period="2026-01-05")
    assert lock.taken.is_set() and lock.released.wait(10)
    assert state.name == "Completed", state.message
    assert outcomes(report) == dict.fromkeys(subjects, "new")
    assert sorted(probe.transforms) == subjects
    assert isinstance(report, TickReport)
    assert all(len(env.ledger.outbox.messages(run_id=s.run_id)) == 1 for s in report.subjects)


def cancelled_in_first_collect(subjects: list[str],
                               meanwhile: Callable[[Probe], None] | None = None) -> Probe:
    """A tick of a probe job over ``subjects`` whose flow run is cancelled while its first
    subject collects; ``meanwhile`` runs before that collect is let go. Returns the probe once
    the tick's thread has ended."""
    collecting, cancelled = threading.Event(), threading.Event()

    def hold_the_first_collect(_subject: str) -> None:
        collecting.set()
        assert cancelled.wait(30), "the flow run was not cancelled"

    probe = probe_job(subjects, ["ops@example.com"], on_collect=hold_the_first_collect)

    async def cancel_while_collecting() -> None:
        tick = asyncio.ensure_future(run_job(job=probe.name, period="2026-01-05"))
        assert await asyncio.to_thread(collecting.wait, 30)
        tick.cancel()
        with pytest.raises(asyncio.CancelledError):
            await tick
        try:
            if meanwhile is not None:
                await asyncio.to_thread(meanwhile, probe)
        finally:
            cancelled.set()

    asyncio.run(cancel_while_collecting())  # returns once the tick's thread has ended
    return probe


def test_a_cancelled_flow_run_starts_no_more_stages_and_releases_its_subjects(
        env: Env) -> None:
    """The flow run is cancelled while its first subject collects (one subject at a time):
    the five queued behind it are released at once, while that collect still runs (a worker's
    SIGKILL after its grace period would otherwise leave them leased), and never collected;
    the first keeps its stored raw input but never reaches the model; all six Runs are pending
    again; the next flow run for the period completes them without collecting the first one
    again."""
    subjects = [f"s{i}" for i in range(6)]
    env.set(subject_concurrency=1)

    def released_while_s0_collects(probe: Probe) -> None:
        def holders() -> dict[str, str | None]:
            return {r.subject: r.owner for r in env.ledger.runs(job=probe.name)}

        wait_until(lambda: not any(holders()[s] for s in subjects[1:]), 10,
                   "the queued subjects' Runs to be released")
        assert holders()["s0"] is not None  # its collect is still under way

    probe = cancelled_in_first_collect(subjects, released_while_s0_collects)
    assert (probe.collects, probe.transforms, env.model_calls()) == (["s0"], [], 0)
    runs = {r.subject: r for r in env.ledger.runs(job=probe.name)}
    assert {s: r.status for s, r in runs.items()} == dict.fromkeys(subjects, "pending")
    assert runs["s0"].raw_input is not None and runs["s1"].raw_input is None
    assert "cancelled or timed out before transform" in (runs["s0"].error or "")
    assert "cancelled or timed out before collect" in (runs["s1"].error or "")
    stopped = [r.run_id for r in runs.values()]
    wait_until(lambda: run_events("runledger.run.stopped", stopped) == len(subjects), 30,
               "an event per stopped subject")
    assert run_events("runledger.run.failed", stopped) == 0
    state, report = env.run(probe.name, period="2026-01-05")
    assert state.name == "Completed", state.message
    assert outcomes(report) == dict.fromkeys(subjects, "new")
    assert (probe.collects, sorted(probe.transforms)) == (subjects, subjects)


def test_a_cancelled_flow_run_claims_none_of_its_later_batches(env: Env) -> None:
    """In batches of two, the flow run is cancelled while its first subject collects: the
    other subject of that batch is released, the four of the later batches are never
    registered nor claimed, and all six are reported stopped; the next flow run completes
    them."""
    subjects = [f"s{i}" for i in range(6)]
    env.set(subject_concurrency=1, claim_batch=2)
    probe = cancelled_in_first_collect(subjects)
    runs = {r.subject: r for r in env.ledger.runs(job=probe.name)}
    assert {s: r.status for s, r in runs.items()} == {"s0": "pending", "s1": "pending"}
    period = probe.job.parse_period("2026-01-05")
    stopped = [probe.job.identity(s, period).run_id for s in subjects]
    wait_until(lambda: run_events("runledger.run.stopped", stopped) == len(subjects), 30,
               "an event per stopped subject")
    state, report = env.run(probe.name, period="2026-01-05")
    assert state.name == "Completed", state.message
    assert outcomes(report) == dict.fromkeys(subjects, "new")


@postgres_only
def test_a_flow_run_past_its_timeout_releases_the_subjects_it_did_not_start(env: Env) -> None:
    """With timeout_seconds=1 and a first collect that takes 2 s, the flow run times out: the
    other subjects are never collected and every Run is pending again."""
    subjects = ["s0", "s1", "s2"]
    env.set(subject_concurrency=1)
    probe = probe_job(subjects, ["ops@example.com"], on_collect=lambda _: time.sleep(2))
    state = final_state(run_job.with_options(timeout_seconds=1)(
        job=probe.name, period="2026-01-05", return_state=True))
    assert state.name == "TimedOut", state
    assert (probe.collects, probe.transforms) == (["s0"], [])
    runs = env.ledger.runs(job=probe.name)
    assert sorted((r.subject, r.status) for r in runs) == [(s, "pending") for s in subjects]


def test_the_run_graph_links_each_subjects_collect_transform_and_persist(env: Env) -> None:
    """Each stage's input is linked to the task run that returned it, so the Prefect UI draws
    collect -> transform -> persist; a transform on raw input that an earlier attempt stored has
    no upstream task run."""
    env.set(task_retries=0)
    probe = probe_job(transform_errors=[TimeoutError("model slow")])
    failed, _ = env.run(probe.name, period="2026-01-05")
    done, _ = env.run(probe.name, period="2026-01-05")
    assert (failed.is_failed(), done.name) == (True, "Completed")
    with get_client(sync_client=True) as client:
        def task_runs(flow_run: State[Any]) -> dict[str, Any]:
            return {t.name: t for t in client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[flow_run.state_details.flow_run_id])))}

        wait_until(lambda: len(task_runs(failed)) == 3 and len(task_runs(done)) == 3, 30,
                   "both flow runs' task runs")
        first, second = task_runs(failed), task_runs(done)

    def upstream(task_run: Any, parameter: str) -> list[Any]:
        return [(i.input_type, i.id) for i in task_run.task_inputs[parameter]]

    assert sorted(first) == ["collect[acme]", "register+claim[1 subjects]", "transform[acme]"]
    assert upstream(first["transform[acme]"], "raw") == [
        ("task_run", first["collect[acme]"].id)]
    assert sorted(second) == ["persist[acme]", "register+claim[1 subjects]", "transform[acme]"]
    assert upstream(second["transform[acme]"], "raw") == []
    assert upstream(second["persist[acme]"], "candidate") == [
        ("task_run", second["transform[acme]"].id)]


def test_daily_credit_commits_its_credit_with_the_completion(env: Env) -> None:
    """One credit row per account and day, whatever the number of reruns."""
    from sqlmodel import Session, col, select

    from flows.jobs.daily_credit import Credit, balance

    env.set(daily_credit_accounts="alice,bob", daily_credit_units=10)
    first, _ = env.run("daily-credit", period="2026-01-05")
    second, _ = env.run("daily-credit", period="2026-01-05")
    next_day, _ = env.run("daily-credit", ["alice"], period="2026-01-06")
    assert [outcome_name(s) for s in (first, second, next_day)] == ["Completed", "Duplicate", "Completed"]
    with Session(env.ledger.engine) as session:
        credits = session.exec(select(Credit).order_by(col(Credit.account), col(Credit.day))).all()
        assert [(c.account, c.day.isoformat(), c.units) for c in credits] == [
            ("alice", "2026-01-05", 10), ("alice", "2026-01-06", 10), ("bob", "2026-01-05", 10)]
        assert balance(session, "alice") == 20


def test_a_failing_effect_leaves_no_completion_no_outbox_rows_and_no_business_row(
        env: Env) -> None:
    """The effect runs inside the completion's transaction: its failure undoes all three."""
    from sqlmodel import Session, select

    from flows.jobs.daily_credit import Credit, CreditTables

    def effect(session: Session, output: dict[str, Any]) -> None:
        session.add(Credit(account="acme", day=datetime(2026, 1, 5).date(), units=5))
        session.flush()
        raise RuntimeError("the business rule refused the credit")

    probe = probe_job(effect=effect, tables=CreditTables.metadata)
    state, report = env.run(probe.name, period="2026-01-05")
    assert state.is_failed() and "refused the credit" in (state.message or "")
    run_id = outcomes_run_id(report)
    assert env.ledger.get(run_id).status == "failed"
    assert env.ledger.outbox.messages(run_id=run_id) == []
    with Session(env.ledger.engine) as session:
        assert session.exec(select(Credit)).all() == []


def outcomes_run_id(report: TickReport | BaseException) -> str:
    assert isinstance(report, TickReport)
    return report.subjects[0].run_id


def test_a_ledger_that_stays_locked_through_register_and_claim_fails_every_pending_subject(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_api: str) -> None:
    """SQLite's write lock held by another connection (a real fault only SQLite has): the
    batched read passes, register+claim gives up after its retries with LedgerBusy, every
    pending subject is reported failed with it, and nothing is written."""

    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    with pipeline_env(url, tmp_path, monkeypatch) as env:
        env.ledger.migrate()
        env.set(sqlite_busy_timeout_ms=20, sqlite_locked_retries=1, task_retries=1)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            state, report = env.run(SUMMARY, period="2026-01-05")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert_every_pending_subject_failed_busy(env, state, report)


def test_a_postgres_ledger_whose_runs_table_stays_locked_fails_every_pending_subject(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_api: str,
        postgres_databases: Any) -> None:
    """The runs table held by another session (an operator's migration) through a whole
    tick: the batched read passes, register+claim gives up after the lock timeout and its
    task retry with LedgerBusy, every pending subject is failed with it, nothing is written."""
    url = postgres_databases.create()
    try:
        with pipeline_env(url, tmp_path, monkeypatch) as env:
            env.set(postgres_lock_timeout_ms=100, task_retries=1)
            with postgres_databases.hold(url, "LOCK TABLE runs IN EXCLUSIVE MODE") as holder:
                state, report = env.run(SUMMARY, period="2026-01-05")
                holder.rollback()
            assert_every_pending_subject_failed_busy(env, state, report)
    finally:
        postgres_databases.drop(url)


def assert_every_pending_subject_failed_busy(
        env: Env, state: State[Any], report: TickReport | BaseException) -> None:
    assert state.name == "Failed"
    assert isinstance(report, TickReport)
    assert {s.subject: s.outcome for s in report.subjects} == {
        "acme": "failed", "globex": "failed"}
    assert all("LedgerBusy" in (s.error or "") for s in report.subjects)
    assert env.ledger.runs() == [] and env.model_calls() == 0


def test_every_model_call_is_counted_on_its_attempt_and_its_run_failed_ones_too(
        env: Env, model_server: ModelServer) -> None:
    """A 500 with no retry fails the first Attempt after one call; the next flow run's Attempt
    gets a 500, retries and completes: the ledger counts 1 + 2 calls, as the server saw them."""
    env.set(task_retries=0)
    model_server.script.append(Reply(500))
    first, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert first.is_failed()
    env.set(task_retries=2)
    model_server.script.append(Reply(500))
    second, _ = env.run(SUMMARY, ["acme"], "2026-01-05")
    assert second.name == "Completed"
    run = env.the_run("acme", "2026-01-05")
    assert run.model_calls == len(model_server.requests) == 3
    assert [(a.outcome, a.model_calls) for a in env.ledger.attempts(run.run_id)] == [
        ("released", 1), ("completed", 2)]


def test_the_completed_event_carries_what_the_run_spent_over_every_attempt(
        env: Env, model_server: ModelServer) -> None:
    """acme's first worker died with its call in flight (its lease ended); the tick's attempt
    calls again and completes it: the runledger.run.completed event and the tick's report say
    this attempt made 1 call, and the Run paid 2 (1 lost) with the answered call's tokens and
    cost. globex had no earlier attempt: 1 call paid. Both as the ledger's records say."""
    env.set(model_prices='{"probe-model": {"input": "0.15", "output": "0.60"}}',
            model_currency="USD")
    probe = probe_job(["acme", "globex"])
    period = probe.job.parse_period("2026-01-05")
    identity = probe.job.identity("acme", period)
    dead = env.ledger.register_and_claim_many(
        [(identity, probe.job.run_params("acme", period))], owner="w:dead", lease=0.2,
    )[identity.run_id].claim
    assert dead is not None
    env.ledger.calls.record_intent(dead, Intent("loopback", "probe-model", 0, "4" * 64))
    wait_for_db_clock(env.ledger, dead.lease_expires_at)
    state, report = env.run(probe.name, None, "2026-01-05")
    assert state.name == "Completed" and outcomes(report) == {"acme": "new", "globex": "new"}
    one_call = {"calls_paid": 1, "calls_lost": 0, "calls_failed": 0, "calls_refused": 0,
                "calls_in_flight": 0, "calls_queued": 0, "calls_batched": 0, "batch_saved": {},
                "calls_reused": 0, "tokens": 150, "cached_tokens": 0, "cache_write_tokens": 0,
                "cost": {"USD": "0.000036"}, "calls_without_price": 0,
                "calls_of_unknown_cost": 0, "calls_over_bound": 0, "tokens_over_bound": 0}
    expected = {"acme": {**one_call, "calls_paid": 2, "calls_lost": 1,
                         "calls_of_unknown_cost": 1}, "globex": one_call}
    assert isinstance(report, TickReport)
    shown = {s.subject: s.as_dict() for s in report.subjects}
    assert {s: d["run_spend"] for s, d in shown.items()} == expected
    assert {s: spend_of([c.model_dump() for c in env.ledger.calls.of_run(d["run_id"])]
                        ).as_dict() for s, d in shown.items()} == expected
    run_ids = [d["run_id"] for d in shown.values()]
    wait_until(lambda: run_events("runledger.run.completed", run_ids) == 2, 60,
               "the completed events")
    with get_client(sync_client=True) as client:
        events = client.read_events(EventFilter(
            event=EventNameFilter(name=["runledger.run.completed"]),
            resource=EventResourceFilter(id=[f"runledger.run.{r}" for r in run_ids])),
            limit=50).events
    payloads = {e.resource["runledger.subject"]: e.payload for e in events}
    assert {s: (p["model_calls"], p["tokens"]) for s, p in payloads.items()} == {
        "acme": (1, 150), "globex": (1, 150)}
    assert {s: p["run_spend"] for s, p in payloads.items()} == expected


def test_a_completed_run_records_the_flow_run_and_persist_task_run_that_completed_it(
        env: Env) -> None:
    """The Run's output location is the flow run that completed it and its persist task run;
    a rerun (Duplicate) leaves them as they are."""
    probe = probe_job(["acme"], ["ops@example.com"])
    first, _ = env.run(probe.name, period="2026-01-05")
    second, _ = env.run(probe.name, period="2026-01-05")
    assert (outcome_name(first), outcome_name(second)) == ("Completed", "Duplicate")
    run = env.ledger.get(probe.job.identity("acme", probe.job.parse_period("2026-01-05")).run_id)
    assert run.completed_flow_run_id == str(first.state_details.flow_run_id)
    assert run.completed_task_run_id is not None
    with get_client(sync_client=True) as client:
        task_run = client.read_task_run(UUID(run.completed_task_run_id))
    assert task_run.name == "persist[acme]"
    assert str(task_run.flow_run_id) == run.completed_flow_run_id


def test_each_run_job_flow_run_refreshes_the_jobs_status_board_artifact(env: Env) -> None:
    """Every flow run of run-job creates the next version of ``runledger-status-<job>``: after
    yesterday's tick it shows yesterday completed with its attempt and model call."""
    now = env.ledger.now()
    probe = probe_job(["acme"], ["ops@example.com"], start=now - timedelta(days=1),
                      grace=timedelta(days=1))
    yesterday = probe.job.period_at(now - timedelta(days=1)).label
    for _ in range(2):
        state, _ = env.run(probe.name, period=yesterday)
        assert outcome_name(state) in ("Completed", "Duplicate")
    boards = status_boards(probe.name)
    assert len(boards) == 2
    [row] = [r for r in boards[0] if r["period"] == yesterday]
    assert (row["owed"], row["completed"], row["attempts"], row["model_calls"]) == (1, 1, 1, 1)


def test_the_stats_agree_with_the_events_the_flows_emit(env: Env) -> None:
    """Two ticks of four subjects, one held by another worker: per the ledger's stats and per
    the Prefect events alike, 3 completed, 3 duplicates, 2 in progress elsewhere, and as many
    model calls as the call log saw."""
    probe = probe_job(["s0", "s1", "s2", "s3"], ["ops@example.com"])
    period = probe.job.parse_period("2026-01-05")
    held_run = probe.job.identity("s3", period)
    held = env.ledger.register_and_claim_many([(held_run, probe.job.run_params("s3", period))],
                                              owner="other:1", lease=600)[held_run.run_id]
    assert held.claim is not None
    since = datetime.combine(env.ledger.now().date(), datetime.min.time(), UTC)
    for _ in range(2):
        env.run(probe.name, period="2026-01-05")
    [day] = daily_stats(env.ledger.activity(since, probe.name), since,
                        env.ledger.calls.since(since, probe.name))
    run_ids = [probe.job.identity(s, period).run_id for s in ("s0", "s1", "s2", "s3")]
    expected = {"runledger.run.completed": day.completed,
                "runledger.run.duplicate": day.duplicates,
                "runledger.run.in-progress-elsewhere": day.in_progress_elsewhere}
    assert list(expected.values()) == [3, 3, 2]

    def seen(name: str, count: int) -> Callable[[], bool]:
        return lambda: run_events(name, run_ids) == count
    for name, count in expected.items():
        wait_until(seen(name, count), 120, name)
    assert day.model_calls == env.model_calls() == 3
    assert (day.attempts, dict(day.attempts_per_completed)) == (4, {1: 3})


def test_a_refused_status_artifact_is_logged_and_leaves_the_flow_run_completed(
        prefect_api: str, caplog: pytest.LogCaptureFixture) -> None:
    """The status board is monitoring: a server error on its artifact call is a warning, and
    the flow run that created it still completes."""
    job = quiet_job()
    now = datetime.now(UTC)
    upcoming = job.period_at(now)
    board = Board(job, now, [], upcoming, job.due_at(upcoming))
    with RefusingApi() as refusing:

        @flow
        async def refreshed() -> str:
            with temporary_settings({PREFECT_API_URL: f"{refusing.origin}/api"}):
                await asyncio.to_thread(asyncio.run, create_status_artifact(board))
            return "tick done"

        state = final_state(refreshed(return_state=True))
    assert state.is_completed() and state.result() == "tick done"
    assert refusing.requests, "the artifact call never reached the refusing server"
    assert any(r.levelname == "WARNING"
               and f"could not create the status artifact 'runledger-status-{job.name}'"
               in r.getMessage() for r in caplog.records)


def test_a_ledger_that_cannot_give_the_board_after_a_tick_is_logged_not_raised(
        empty_db_url: str, prefect_api: str, caplog: pytest.LogCaptureFixture) -> None:
    """After its work, a tick's board read failing (here: a ledger without its schema) is a
    warning and no board, not a failed flow run."""
    job = quiet_job()
    report = TickReport(job.name, job.version, job.period_at(datetime.now(UTC)), [])
    ledger = Ledger.connect(empty_db_url)

    @flow
    def evidence() -> bool:
        return after_tick(ledger, job, report) is None

    try:
        state = evidence(return_state=True)
    finally:
        ledger.close()
    assert state.is_completed() and state.result() is True
    assert any(r.levelname == "WARNING" and "or read its status board" in r.getMessage()
               for r in caplog.records)


def test_a_quick_run_without_a_period_runs_the_latest_period_already_due(env: Env) -> None:
    """The UI's Quick run (no period) of a daily job due at 23:59 runs yesterday's period, the
    latest one due, never today's, whose content would be locked in early."""
    now = datetime.now(UTC)
    # Of two zones 12 hours apart, one is far from its 23:59 right now.
    zone = "UTC" if now.hour < 20 else "Etc/GMT-12"
    probe = probe_job(("acme",), timezone=zone, due=timedelta(hours=23, minutes=59))
    state, _ = env.run(probe.name)
    assert outcome_name(state) == "Completed", state.message
    yesterday = probe.job.period_at(now).start - timedelta(days=1)
    [run] = env.ledger.runs(job=probe.name)
    assert run.period_start == yesterday, run.period_start


def test_a_custom_run_of_a_period_not_yet_due_is_refused_unless_allowed(env: Env) -> None:
    """The UI's Custom run with a future `period`: the flow run fails naming the flag and the
    parameter, nothing is written; with allow_not_due it runs."""
    probe = probe_job(("acme",))
    state, result = env.run(probe.name, period="2099-01-05")
    assert state.is_failed() and isinstance(result, PeriodNotDue), state.message
    assert "--allow-not-due (CLI) or the parameter allow_not_due=true" in str(result)
    assert env.ledger.runs(job=probe.name) == []
    allowed = final_state(run_job(
        job=probe.name, period="2099-01-05", allow_not_due=True, return_state=True))
    assert outcome_name(allowed) == "Completed", allowed.message
