"""Workers that die, freeze or lose a reply: real `runledger run` processes killed with SIGKILL
or stopped with SIGSTOP, against the session's Prefect server and real ledgers."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from flows.jobs import Candidate
from flows.model import OfflineModel
from flows.prices import NO_PRICES
from flows.run_job.lease_keeper import LeaseKeeper
from flows.run_job.outcomes import outcome_name
from flows.run_job.tasks import persist_output
from flows.run_job.tick import Held, Persisted, Tick
from flows.settings import RunledgerSettings
from store import AFTER_MODEL_ANSWER
from store.faults import AFTER_CHECKPOINT_COMMIT
from tests.support.pipeline import (
    ACME,
    SUMMARY,
    Env,
    ModelServer,
    Reply,
    Worker,
    lease_expired,
    outbox_recipients,
    outcomes,
    probe_job,
    wait_until,
)

PERIOD = "2026-01-05"


# Its worker and CLI subprocesses, too, use the session's Prefect server.
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("subprocesses_use_the_session_server")]


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Worker subprocesses, killed at the end whatever happened."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


def start_worker(env: Env, workers: list[Worker], **settings: object) -> Worker:
    env.set(**settings)
    worker = Worker.start([SUMMARY, "--subject", "acme", "--period", PERIOD])
    workers.append(worker)
    return worker


def in_transform(env: Env, worker: Worker) -> bool:
    """The worker has logged its model call: it is inside the transform."""
    return any(e["pid"] == worker.pid for e in env.calls())


def test_a_worker_killed_after_the_completion_commit_leaves_the_stored_output(
        env: Env, workers: list[Worker]) -> None:
    """The retry after a crash between commit and acknowledgement returns the stored output."""
    worker = start_worker(env, workers, faults="after_complete_commit")
    code, report, _ = worker.finish()
    assert code == -signal.SIGKILL and report is None
    env.monkeypatch.delenv("RUNLEDGER_FAULTS")
    run = env.the_run("acme", PERIOD)
    assert run.status == "completed"
    state, again = env.run(SUMMARY, ["acme"], PERIOD)
    assert outcome_name(state) == "Duplicate" and outcomes(again) == {"acme": "duplicate"}
    assert env.the_run("acme", PERIOD).output == run.output
    assert env.model_calls() == 1
    assert outbox_recipients(env.ledger, run.run_id) == ACME


def test_a_worker_killed_after_the_models_answer_leaves_the_run_to_be_transformed_again(
        env: Env, workers: list[Worker]) -> None:
    """A kill between the model's answer and the completion commit loses that call: the Run
    stays uncompleted, and the next attempt once the lease expires calls the model again and
    completes it with one set of outbox rows."""
    worker = start_worker(env, workers, faults=AFTER_MODEL_ANSWER, lease_seconds=2)
    code, report, _ = worker.finish()
    assert code == -signal.SIGKILL and report is None
    env.monkeypatch.delenv("RUNLEDGER_FAULTS")
    killed = env.the_run("acme", PERIOD)
    assert killed.status == "running" and killed.raw_input is not None
    assert env.model_calls() == 1 and outbox_recipients(env.ledger, killed.run_id) == []
    wait_until(lambda: lease_expired(env.ledger, killed.run_id), 30, "the dead worker's lease")
    state, rerun = env.run(SUMMARY, ["acme"], PERIOD)
    assert state.name == "Completed" and outcomes(rerun) == {"acme": "new"}
    assert env.model_calls() == 2
    assert [a.outcome for a in env.ledger.attempts(killed.run_id)] == ["expired", "completed"]
    assert outbox_recipients(env.ledger, killed.run_id) == ACME


def test_a_worker_killed_after_the_answer_was_checkpointed_is_completed_without_a_second_call(
        env: Env, workers: list[Worker]) -> None:
    """SIGKILL right after the commit that recorded the answer and its checkpoint: the next
    attempt replays the checkpointed answer and completes the Run; the model was called once."""
    worker = start_worker(env, workers, faults=AFTER_CHECKPOINT_COMMIT, lease_seconds=2)
    code, report, _ = worker.finish()
    assert code == -signal.SIGKILL and report is None
    env.monkeypatch.delenv("RUNLEDGER_FAULTS")
    killed = env.the_run("acme", PERIOD)
    wait_until(lambda: lease_expired(env.ledger, killed.run_id), 30, "the dead worker's lease")
    state, rerun = env.run(SUMMARY, ["acme"], PERIOD)
    assert state.name == "Completed" and outcomes(rerun) == {"acme": "new"}
    [call] = env.calls()
    assert (call["outcome"], call["reuses"]) == ("answered", 1)
    completed = env.the_run("acme", PERIOD)
    assert completed.status == "completed" and completed.output is not None
    assert [a.outcome for a in env.ledger.attempts(killed.run_id)] == ["expired", "completed"]
    assert outbox_recipients(env.ledger, killed.run_id) == ACME


def test_a_worker_killed_during_the_call_leaves_it_lost_and_the_next_attempt_pays_again(
        env: Env, workers: list[Worker], model_server: ModelServer) -> None:
    """SIGKILL while the OpenAI-compatible server holds the answer: the call is recorded in
    flight; the next attempt marks it lost and calls again: 2 paid, 1 lost, with usage."""
    model_server.script.append(Reply(delay=60))
    worker = start_worker(env, workers, lease_seconds=3)
    # Recorded before it leaves, and held by the server: the call is under way.
    wait_until(lambda: in_transform(env, worker) and len(model_server.requests) == 1, 90,
               "the server to hold the worker's model call")
    worker.signal(signal.SIGKILL)
    worker.finish()
    run_id = env.the_run("acme", PERIOD).run_id
    wait_until(lambda: lease_expired(env.ledger, run_id), 30, "the dead worker's lease")
    env.set(lease_seconds=900)
    state, rerun = env.run(SUMMARY, ["acme"], PERIOD)
    assert state.name == "Completed" and outcomes(rerun) == {"acme": "new"}
    calls = env.ledger.calls.of_run(run_id)
    # The first call is lost; the next attempt pays again (a call the stage retried, if the
    # loaded machine timed one out, is recorded failed between them).
    assert calls[0].outcome == "lost" and calls[-1].outcome == "answered", calls
    assert all(c.outcome == "failed" for c in calls[1:-1]), calls
    assert (calls[-1].prompt_tokens, calls[-1].completion_tokens) == (120, 30)
    assert len(model_server.requests) == len(calls)


def test_a_worker_killed_while_holding_the_lease_is_replaced_once_the_lease_expires(
        env: Env, workers: list[Worker]) -> None:
    """While the dead worker's lease lasts nobody calls the model, and the flow run says who
    holds the Run until when; after it, one worker does."""
    worker = start_worker(env, workers, offline_model_delay_seconds=60, lease_seconds=8)
    wait_until(lambda: in_transform(env, worker), 90, "the worker's model call")
    worker.signal(signal.SIGKILL)
    worker.finish()
    env.set(offline_model_delay_seconds=0, lease_seconds=900)
    state, report = env.run(SUMMARY, ["acme"], PERIOD)
    assert outcome_name(state) == "InProgressElsewhere"
    assert outcomes(report) == {"acme": "in-progress-elsewhere"}
    assert env.model_calls() == 1
    held = env.the_run("acme", PERIOD)
    assert held.owner is not None and held.lease_expires_at is not None
    until = held.lease_expires_at.isoformat(timespec="seconds")
    assert f"(acme: leased by {held.owner} until {until})" in (state.message or "")
    run_id = held.run_id
    wait_until(lambda: lease_expired(env.ledger, run_id), 30, "the dead worker's lease to expire")
    state, rerun = env.run(SUMMARY, ["acme"], PERIOD)
    assert state.name == "Completed" and outcomes(rerun) == {"acme": "new"}
    assert env.model_calls() == 2
    attempts = env.ledger.attempts(run_id)
    assert [a.outcome for a in attempts] == ["expired", "completed"]
    assert attempts[0].owner != attempts[1].owner
    assert outbox_recipients(env.ledger, run_id) == ACME


def test_a_stale_workers_persist_is_rejected_after_another_worker_took_over(
        env: Env, workers: list[Worker]) -> None:
    """A worker frozen past its lease wakes up after another completed the Run: it discards
    its candidate (LeaseLost, not a crash) and the other worker's result and rows stay."""
    stale = start_worker(env, workers, offline_model_delay_seconds=3, lease_seconds=2)
    wait_until(lambda: in_transform(env, stale), 90, "the worker's model call")
    stale.signal(signal.SIGSTOP)
    run_id = env.the_run("acme", PERIOD).run_id
    wait_until(lambda: lease_expired(env.ledger, run_id), 30, "the frozen worker's lease to expire")
    env.set(offline_model_delay_seconds=0, lease_seconds=900)
    state, _ = env.run(SUMMARY, ["acme"], PERIOD)
    assert state.name == "Completed"
    completed = env.ledger.get(run_id)
    stale.signal(signal.SIGCONT)
    code, report, err = stale.finish()
    assert code == 0, err
    assert report is not None and report["state"] == "LeaseLost"
    assert report["subjects"][0]["outcome"] == "lease-lost"
    after = env.ledger.get(run_id)
    assert (after.completed_attempt_id, after.output) == (completed.completed_attempt_id,
                                                          completed.output)
    assert outbox_recipients(env.ledger, run_id) == ACME
    assert env.model_calls() == 2


def test_a_subject_whose_lease_was_taken_while_it_waited_for_a_pool_slot_ends_without_a_model_call(
        env: Env, workers: list[Worker]) -> None:
    """One pool slot: the second subject waits, claimed, while the first one's model call runs.
    The worker freezes past the lease and another owner takes the waiting Run; once resumed,
    the worker completes the first subject and ends the second as lease-lost, no model call."""
    env.set(subject_concurrency=1, offline_model_delay_seconds=3, lease_seconds=2)
    worker = Worker.start([SUMMARY, "--period", PERIOD])
    workers.append(worker)
    wait_until(lambda: in_transform(env, worker), 90, "the first subject's model call")
    worker.signal(signal.SIGSTOP)
    first = env.calls()[0]["subject"]
    (second,) = {"acme", "globex"} - {first}
    waiting = env.the_run(second, PERIOD)
    assert waiting.status == "running" and waiting.raw_input is None
    wait_until(lambda: lease_expired(env.ledger, waiting.run_id), 30, "the waiting lease to expire")
    assert env.ledger.claim(waiting.run_id, "other-worker", 60) is not None
    worker.signal(signal.SIGCONT)
    code, report, err = worker.finish()
    assert code == 0, err
    assert report is not None and report["state"] == "LeaseLost"
    assert {s["subject"]: s["outcome"] for s in report["subjects"]} == {
        first: "new", second: "lease-lost"}
    assert [e["subject"] for e in env.calls()] == [first]
    assert env.ledger.get(waiting.run_id).owner == "other-worker"
    assert env.the_run(first, PERIOD).status == "completed"


def test_a_persist_retried_after_its_reply_was_lost_finds_its_own_completion(env: Env) -> None:
    """Persisting again with the same claim reports this attempt's completion, not a lost lease."""
    probe = probe_job()
    period = probe.job.parse_period(PERIOD)
    identity = probe.job.identity("acme", period)
    env.ledger.register(identity, probe.job.run_params("acme", period))
    claim = env.ledger.claim(identity.run_id, "test-worker", 60)
    assert claim is not None
    tick = Tick(probe.job, period, env.ledger, OfflineModel(), NO_PRICES, None, RunledgerSettings(),
                "flow-run")
    keeper = LeaseKeeper(env.ledger, 60)
    keeper.hold([claim])
    candidate = Candidate("summary", "offline")
    first = persist_output.fn("acme", Held(tick, claim, keeper), candidate)
    again = persist_output.fn("acme", Held(tick, claim, keeper), candidate)
    assert (first.name, again.name) == ("Completed", "Completed")
    assert isinstance(again.data, Persisted) and again.data.outbox_rows == 2
    assert len(env.ledger.outbox.messages(run_id=identity.run_id)) == 2
