"""A tick in batch mode through the real run-job and settle-batches flows, against an
OpenAI-compatible Files + Batches server on loopback driven by the official SDK, on both
ledgers: the tick queues every call (recorded before it is submitted) into one batch created
once, its Runs wait without a lease or an attempt spent and its flow run is Paused as
AwaitingBatch; a poll settles each result once at the batch price, runs the Runs again (each
transform replays its answer, no call is made twice) and completes the tick. An expired batch
is settled for what it answered and the rest sent in a new batch; a refused line fails its
Run alone; near its deadline (or past it: the batch is cancelled) what a batch ended without is
called synchronously, once; a create whose reply was lost is found by its key, never created again; a batch
tick of a model without a Batch API is refused before anything is written."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import pytest
from prefect.client.orchestration import get_client
from typer.testing import Result

from bench.batch_provider import BatchServer
from flows.prices import money
from flows.run_job.outcomes import outcome_name
from flows.settle.flow import SettleReport, settle_batches
from tests.support.pipeline import Env, final_state, outcomes, probe_job, wait_until

PRICES = {"probe-model": {"input": "2", "output": "8"}}  # USD per million tokens
# The server's usage per answer (tests/support/selected.py): 100 prompt, 20 completion.
SYNC_COST_NANOS = (100 * 2 + 20 * 8) * 1000  # 0.00036 USD at the synchronous price
PERIOD = "2026-12-01"


@pytest.fixture
def selected(env: Env, batch_server: BatchServer) -> BatchServer:
    """The batch server, selected through RUNLEDGER_MODEL=openai, with prices in USD."""
    env.set(model="openai", model_base_url=batch_server.base_url, model_name="probe-model",
            model_api_key="sk-test", model_prices=json.dumps(PRICES), model_currency="USD",
            batch_lease_seconds=30)
    return batch_server


def settle() -> tuple[str, SettleReport]:
    """One settle-batches flow run: its state's type and its report."""
    state = final_state(settle_batches(return_state=True))
    report = state.result(raise_on_failure=False)
    assert isinstance(report, SettleReport), report
    return str(state.type.value), report


def statuses(env: Env, job: str) -> Counter[str]:
    return Counter(r.status for r in env.ledger.runs(job=job))


def flow_run_state(flow_run_id: str) -> tuple[str, str | None]:
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state  # type: ignore[arg-type]
    assert state is not None
    return str(state.type.value), state.name


def test_a_batch_tick_queues_every_call_into_one_batch_and_its_runs_wait_without_a_lease(
        env: Env, selected: BatchServer) -> None:
    """Three subjects: one batch of three requests created once, no chat completion sent, the
    Runs waiting with no owner and no attempt spent, the flow run Paused as AwaitingBatch
    naming the batch."""
    probe = probe_job(["a", "b", "c"], batch=True)
    state, report = env.run(probe.name, None, PERIOD)
    assert state.is_paused() and outcome_name(state) == "AwaitingBatch", state
    assert Counter(outcomes(report).values()) == {"waiting": 3}
    assert len(selected.created) == 1 and len(selected.batches[selected.created[0]].lines) == 3
    assert not any(path.endswith("/chat/completions") for _, path in selected.requests)
    runs = env.ledger.runs(job=probe.name)
    assert {r.status for r in runs} == {"waiting"}
    assert all(r.owner is None and r.attempts == 0 for r in runs)
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert batch.status == "submitted" and batch.requests == 3
    assert batch.provider_batch_id is not None
    assert batch.provider_batch_id in (state.message or "")


def test_a_poll_settles_each_answer_once_at_the_batch_price_and_completes_the_tick(
        env: Env, selected: BatchServer) -> None:
    """The poll settles three answers at half the synchronous price, runs the Runs again
    (each replays its answer: no call made twice), queues each Run's emails once and marks
    the tick's flow run Completed; a second poll finds nothing to do."""
    probe = probe_job(["a", "b", "c"], batch=True)
    state, _ = env.run(probe.name, None, PERIOD)
    kind, report = settle()
    assert kind == "COMPLETED", report.summary()
    [polled] = report.polled
    assert polled.action == "settled" and polled.settled == 3 and len(polled.released) == 3
    assert statuses(env, probe.name) == {"completed": 3}
    calls = env.calls()
    assert len(calls) == 3 and {c["outcome"] for c in calls} == {"answered"}
    assert {c["cost_nanos"] for c in calls} == {SYNC_COST_NANOS // 2}
    for run in env.ledger.runs(job=probe.name):
        assert len(env.ledger.outbox.messages(run_id=run.run_id, limit=10)) == 2
    assert flow_run_state(str(state.state_details.flow_run_id))[0] == "COMPLETED"
    assert sum(selected.creates_by_key.values()) == 1
    _, again = settle()
    assert again.polled == [] and again.reruns == []
    assert len(env.calls()) == 3


def test_costs_show_what_batch_mode_saved_against_the_synchronous_price(
        env: Env, selected: BatchServer, invoke: Callable[..., Result]) -> None:
    """Each settled call records its batch cost and its synchronous cost: `runledger costs`
    says the three calls saved half of 3 x 0.00036 USD, and `runs show` names the batch."""
    probe = probe_job(["a", "b", "c"], batch=True)
    env.run(probe.name, None, PERIOD)
    settle()
    assert {c["sync_cost_nanos"] for c in env.calls()} == {SYNC_COST_NANOS}
    found = json.loads(invoke("costs", "--job", probe.name, "--json").stdout)
    [costs] = found["jobs"]
    assert costs["spent"]["calls_batched"] == 3
    assert costs["spent"]["batch_saved"] == {"USD": str(money(3 * SYNC_COST_NANOS // 2))}
    table = invoke("costs", "--job", probe.name, env={"COLUMNS": "200"}).stdout
    assert "on 3 batched calls" in table
    [batch] = env.ledger.batches.list_batches(limit=10)
    run = env.ledger.runs(job=probe.name)[0]
    assert batch.batch_key in invoke("runs", "show", run.run_id, env={"COLUMNS": "250"}).stdout


def test_on_call_sees_a_run_waiting_on_a_batch_and_what_settles_it(
        env: Env, selected: BatchServer, invoke: Callable[..., Result]) -> None:
    """`runledger overdue` lists the waiting Run as unfinished, with the command that settles
    it; `batches list` and `batches show` name the provider's batch and its calls."""
    probe = probe_job(["a"], batch=True)
    env.run(probe.name, None, PERIOD)
    overdue = invoke("overdue", "--job", probe.name, env={"COLUMNS": "200"}).stdout
    assert "waiting" in overdue and "runledger batches poll" in overdue
    [batch] = env.ledger.batches.list_batches(limit=10)
    listed = json.loads(invoke("batches", "list", "--json").stdout)
    assert [(b["key"], b["provider_batch_id"], b["status"]) for b in listed] == [
        (batch.batch_key, batch.provider_batch_id, "submitted")]
    shown = invoke("batches", "show", str(batch.provider_batch_id),
                   env={"COLUMNS": "200"}).stdout
    assert batch.batch_key in shown and "queued" in shown
    missing = invoke("batches", "show", "rb-nothing")
    assert missing.exit_code == 2 and "runledger batches list" in missing.stderr


def test_a_poll_before_the_batch_ended_leaves_it_running_and_its_runs_waiting(
        env: Env, selected: BatchServer) -> None:
    """A batch still in progress at the provider: the poll notes its status and counts,
    settles nothing; a later poll, once it ended, settles it."""
    selected.polls_until_done = 1
    probe = probe_job(["a", "b"], batch=True)
    env.run(probe.name, None, PERIOD)
    _, first = settle()
    assert [p.action for p in first.polled] == ["waiting"]
    assert statuses(env, probe.name) == {"waiting": 2}
    _, second = settle()
    assert [p.action for p in second.polled] == ["settled"]
    assert statuses(env, probe.name) == {"completed": 2}


def test_an_expired_batch_settles_its_answers_and_sends_the_rest_in_a_new_batch(
        env: Env, selected: BatchServer) -> None:
    """Each batch expires after one result: every poll settles that answer and sends the
    rest in a new batch, until every Run completed; each call answered once, one create per
    batch key."""
    selected.expire_after = 1
    probe = probe_job(["a", "b", "c"], batch=True)
    env.run(probe.name, None, PERIOD)
    _, first = settle()
    [polled] = first.polled
    assert polled.provider_status == "expired"
    assert polled.settled == 1 and polled.requeued == 2 and len(polled.resubmitted) == 1
    assert statuses(env, probe.name) == {"completed": 1, "waiting": 2}
    settle()
    settle()
    assert statuses(env, probe.name) == {"completed": 3}
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": 3}
    assert len(selected.created) == 3 and set(selected.creates_by_key.values()) == {1}


def chat_completions(server: BatchServer) -> int:
    """How many synchronous chat completions the provider was sent."""
    return sum(1 for _, path in server.requests if path.endswith("/chat/completions"))


def test_an_expired_batch_near_its_deadline_calls_the_rest_synchronously_once(
        env: Env, selected: BatchServer) -> None:
    """The batch expires after one result and its deadline is nearer than the margin: that
    answer settles at the batch price, the two others are withdrawn (not billed) and their
    Runs run again in one poll without batch mode, each call sent once at the synchronous
    price; no new batch is created and the tick's flow run ends Completed."""
    env.set(batch_margin_seconds=3 * 86_400)  # the default deadline (a day) is always near
    selected.expire_after = 1
    probe = probe_job(["a", "b", "c"], batch=True)
    state, _ = env.run(probe.name, None, PERIOD)
    kind, report = settle()
    assert kind == "COMPLETED", report.summary()
    [polled] = report.polled
    assert (polled.provider_status, polled.settled, polled.withdrawn, polled.requeued) == (
        "expired", 1, 2, 0)
    assert polled.resubmitted == [] and len(selected.created) == 1
    assert statuses(env, probe.name) == {"completed": 3}
    calls = env.calls()
    assert Counter(c["outcome"] for c in calls) == {"answered": 3, "withdrawn": 2}
    assert sorted(c["cost_nanos"] for c in calls if c["outcome"] == "answered") == [
        SYNC_COST_NANOS // 2, SYNC_COST_NANOS, SYNC_COST_NANOS]
    assert {c["cost_nanos"] for c in calls if c["outcome"] == "withdrawn"} == {None}
    assert chat_completions(selected) == 2
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert (batch.answered, batch.withdrawn, batch.requeued) == (1, 2, 0)
    assert flow_run_state(str(state.state_details.flow_run_id))[0] == "COMPLETED"
    _, again = settle()
    assert again.polled == [] and again.reruns == [] and chat_completions(selected) == 2


def test_a_batch_still_running_past_its_deadline_is_cancelled_and_finished_synchronously(
        env: Env, selected: BatchServer) -> None:
    """A deadline of a millisecond past the tick and a provider still at work: the first poll
    asks the provider to cancel the batch; the next finds it cancelled, withdraws the calls it
    never ran and runs their Runs synchronously; every Run completed, each call paid once."""
    env.set(batch_deadline_seconds=0.001)
    selected.polls_until_done = 10
    probe = probe_job(["a", "b"], batch=True)
    env.run(probe.name, None, PERIOD)
    _, first = settle()
    assert [(p.action, p.provider_status) for p in first.polled] == [
        ("cancelling", "cancelling")]
    assert ("POST", f"/v1/batches/{selected.created[0]}/cancel") in selected.requests
    assert statuses(env, probe.name) == {"waiting": 2}
    _, second = settle()
    [polled] = second.polled
    assert (polled.provider_status, polled.withdrawn) == ("cancelled", 2)
    assert statuses(env, probe.name) == {"completed": 2}
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": 2, "withdrawn": 2}
    assert chat_completions(selected) == 2 and len(selected.created) == 1


def test_a_batch_refused_for_a_full_token_queue_is_sent_again_and_fails_no_run(
        env: Env, selected: BatchServer) -> None:
    """The provider fails the batch as a whole with token_limit_exceeded: no Run fails and the
    calls are queued again, not resent by the failed batch's settlement; once they waited a
    batch lease, a poll sends them in a new batch (in the same poll, when they had waited it
    already), and the Runs complete, each call answered once."""
    env.set(batch_lease_seconds=1)
    selected.queue_full = 1
    probe = probe_job(["a", "b"], batch=True)
    env.run(probe.name, None, PERIOD)
    _, first = settle()
    [polled] = [p for p in first.polled if p.action == "settled"]
    assert (polled.provider_status, polled.requeued, polled.failed) == ("failed", 2, [])
    assert polled.resubmitted == [] and "failed" not in statuses(env, probe.name)

    def completed() -> bool:
        settle()
        return statuses(env, probe.name) == {"completed": 2}

    wait_until(completed, 120, "the Runs of the refused batch completed by later polls")
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": 2}
    assert set(selected.creates_by_key.values()) == {1}
    # Sent again once each: in one new batch, or in two when a loaded machine let only one call
    # wait the batch lease by the first sweep.
    later = selected.created[1:]  # after the batch the provider failed
    resent = Counter(line["custom_id"] for batch in later
                     for line in selected.batches[batch].lines)
    assert sorted(resent.values()) == [1, 1] and 1 <= len(later) <= 2, resent


def test_a_call_too_large_for_the_enqueued_token_limit_is_refused_before_it_is_queued(
        env: Env, selected: BatchServer) -> None:
    """An enqueued-token limit of one token: the call could never enter a batch, so its Run
    fails naming the limit and the fix, and no call is recorded, no batch created."""
    env.set(model_batch_queue_tokens=1)
    probe = probe_job(["a"], batch=True)
    env.run(probe.name, None, PERIOD)
    [run] = env.ledger.runs(job=probe.name)
    assert run.status == "failed" and "enqueued-token limit" in (run.error or ""), run.error
    assert env.calls() == [] and selected.created == []


def test_a_line_the_provider_refused_fails_its_run_and_no_other(
        env: Env, selected: BatchServer) -> None:
    """A 400 for one request of the batch: its Run fails with the provider's words, the
    others complete, and the tick's flow run ends Failed."""
    selected.polls_until_done = 1  # its lines run at the poll, after the error is set
    probe = probe_job(["a", "b"], batch=True)
    state, _ = env.run(probe.name, None, PERIOD)
    refused = next(c for c in env.calls() if c["subject"] == "a")
    selected.line_errors[refused["custom_id"]] = (400, "the prompt is too long")
    settle()
    settle()
    runs = {r.subject: r for r in env.ledger.runs(job=probe.name)}
    assert runs["a"].status == "failed" and "too long" in (runs["a"].error or "")
    assert runs["b"].status == "completed"
    kind, name = flow_run_state(str(state.state_details.flow_run_id))
    assert kind == "FAILED", name


def test_a_create_whose_reply_was_lost_is_found_by_its_key_and_never_created_again(
        env: Env, selected: BatchServer) -> None:
    """The provider created the batch and the connection dropped before its reply: the
    submitter finds it by its key and stores its id; one batch at the provider."""
    selected.drop_after_create = 1
    probe = probe_job(["a", "b"], batch=True)
    state, _ = env.run(probe.name, None, PERIOD)
    assert state.is_paused(), state
    assert len(selected.created) == 1
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert batch.provider_batch_id == selected.created[0]
    settle()
    assert statuses(env, probe.name) == {"completed": 2}


def test_a_batch_tick_of_the_offline_model_is_refused_before_any_run_is_registered(
        env: Env) -> None:
    """The offline model has no Batch API: the tick is NotReady, naming the fix, and no Run,
    call or batch is written."""
    probe = probe_job(["a"], batch=True)
    state, _ = env.run(probe.name, None, PERIOD)
    assert state.is_failed() and state.name == "NotReady", state
    assert "RUNLEDGER_MODEL=openai" in (state.message or "")
    assert env.ledger.runs(job=probe.name) == [] and env.calls() == []


def test_batches_cancel_stops_waiting_the_next_poll_cancels_and_finishes_synchronously(
        env: Env, selected: BatchServer, invoke: Callable[..., Result]) -> None:
    """`runledger batches cancel` on a batch the provider still works on moves its deadline to
    now: the next poll asks the provider to cancel it, the one after calls its two requests
    synchronously, once each; cancelling it again, or an unknown batch, exits 2 naming why."""
    selected.polls_until_done = 10
    probe = probe_job(["a", "b"], batch=True)
    env.run(probe.name, None, PERIOD)
    provider_id = selected.created[0]
    done = invoke("batches", "cancel", provider_id)
    assert done.exit_code == 0 and "deadline is now" in done.stdout, done.output
    assert [(p.action, p.provider_status) for p in settle()[1].polled] == [
        ("cancelling", "cancelling")]
    [polled] = settle()[1].polled
    assert (polled.provider_status, polled.withdrawn) == ("cancelled", 2)
    assert statuses(env, probe.name) == {"completed": 2}
    assert chat_completions(selected) == 2 and len(selected.created) == 1
    again = invoke("batches", "cancel", provider_id)
    assert again.exit_code == 2 and "it is settled" in again.stderr
    unknown = invoke("batches", "cancel", "rb-nothing")
    assert unknown.exit_code == 2 and "runledger batches list" in unknown.stderr
