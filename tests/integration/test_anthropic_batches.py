"""Batch mode through Anthropic's Message Batches, against the API on loopback driven by the
official ``anthropic`` SDK. The client: a batch request's params are the message the
synchronous client sends, a batch created with its requests (no file), polled, its results
read (structured output from the forced tool), errored results transient or permanent by their
error type, cancelled and expired requests transient, batches found without a key by their
time and size. A tick on both ledgers: created once, settled at the batch price; a create
whose reply was lost found without taking another batch of the ledger; a batch past its
deadline cancelled and finished synchronously; an errored request failing its Run alone."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, SecretStr

from bench.anthropic_batch_provider import AnthropicBatchServer
from flows.model import InvalidModelRequest, Message, Parameters, Request
from flows.model.anthropic import AnthropicModel
from flows.model.batch import INLINE, RemoteBatch, ResultLine, Sought
from flows.model.batch.anthropic import AnthropicBatchClient
from flows.settle.flow import SettleReport, settle_batches
from tests.support.pipeline import Env, final_state, probe_job, wait_until

PRICES = {"probe-model": {"input": "2", "output": "8"}}  # USD per million tokens
# The server's usage per answer: 100 input and 20 output tokens.
SYNC_COST_NANOS = (100 * 2 + 20 * 8) * 1000
PERIOD = "2026-12-01"


class Briefing(BaseModel):
    summary: str
    points: list[str]


def client(server: AnthropicBatchServer) -> AnthropicBatchClient:
    return AnthropicBatchClient(server.base_url, "probe-model", SecretStr("sk-ant"),
                                timeout_seconds=5)


def request(n: int, output: type[BaseModel] | None = None) -> Request:
    return Request((Message("system", "Summarize."), Message("user", f"news {n}")),
                   output=output)


def created(batches: AnthropicBatchClient, key: str, count: int,
            output: type[BaseModel] | None = None) -> RemoteBatch:
    """A batch of ``count`` requests c0, c1... created under ``key``."""
    lines = [(f"c{n}", batches.line(request(n, output))) for n in range(count)]
    return batches.create(key, batches.upload(key, lines), lines)


def by_id(results: list[ResultLine]) -> dict[str, ResultLine]:
    return {line.custom_id: line for line in results}


def ended(batches: AnthropicBatchClient, batch: RemoteBatch) -> RemoteBatch:
    """The batch retrieved until it ended (a few polls at most)."""
    for _ in range(10):
        batch = batches.retrieve(batch.id)
        if batch.ended:
            return batch
    raise AssertionError(f"batch {batch.id} did not end in 10 polls: {batch.status}")


def test_a_batch_request_is_the_message_the_synchronous_client_sends(
        anthropic_server: AnthropicBatchServer) -> None:
    """The params are the synchronous body (system apart, max_tokens, sampling, the forced
    tool), with no SDK-only keys; nothing is uploaded: the file id is ``inline``."""
    batches = client(anthropic_server)
    asked = Request((Message("system", "Be brief."), Message("user", "hi")),
                    Parameters(temperature=0.2, max_tokens=50), output=Briefing)
    params = batches.line(asked)
    sync = AnthropicModel(anthropic_server.base_url, "probe-model", SecretStr("sk-ant"))
    assert params == sync.params(asked)
    assert params["system"][0]["text"] == "Be brief." and params["temperature"] == 0.2
    assert params["tool_choice"] == {"type": "tool", "name": "Briefing"}
    assert not {"extra_headers", "extra_body"} & set(params)
    assert batches.upload("k", [("c0", params)]) == INLINE
    assert anthropic_server.requests == []


def test_a_created_batch_gives_each_request_its_answer_and_structured_output_validates(
        anthropic_server: AnthropicBatchServer) -> None:
    """In progress at the first poll, completed at the second; a plain request answers its
    text, a structured one the forced tool's input, which validates; usage as sent."""
    anthropic_server.polls_until_done = 1
    batches = client(anthropic_server)
    lines = [("plain", batches.line(request(0))), ("shaped", batches.line(request(1, Briefing)))]
    batch = batches.create("key-1", INLINE, lines)
    assert (batch.status, batch.ended, batch.total) == ("in_progress", False, 2)
    first = batches.retrieve(batch.id)
    assert (first.status, first.ended) == ("in_progress", False)
    done = batches.retrieve(batch.id)
    assert (done.status, done.ended, done.completed, done.failed) == ("completed", True, 2, 0)
    results = by_id(list(batches.results(done)))
    plain, shaped = results["plain"].generation, results["shaped"].generation
    assert plain is not None and plain.text.startswith("answer ")
    assert shaped is not None and Briefing.model_validate_json(shaped.text).points
    assert (plain.prompt_tokens, plain.completion_tokens) == (100, 20)
    [sent] = [b for b in anthropic_server.batches.values()]
    assert [r["custom_id"] for r in sent.requests] == ["plain", "shaped"]


@pytest.mark.parametrize(("status", "transient"), [(400, False), (429, True), (500, True),
                                                    (529, True)])
def test_an_errored_request_is_transient_or_permanent_by_its_error_type(
        anthropic_server: AnthropicBatchServer, status: int, transient: bool) -> None:
    """An errored result names its error type; asking again may succeed after 429, 5xx and
    529 (overloaded), never after another 4xx."""
    anthropic_server.line_errors["c1"] = (status, "no luck")
    batches = client(anthropic_server)
    results = by_id(list(batches.results(ended(batches, created(batches, "key-e", 2)))))
    assert results["c0"].generation is not None
    errored = results["c1"]
    assert errored.generation is None and errored.status == status
    assert errored.transient is transient and "no luck" in (errored.error or "")


def test_a_cancelled_batch_ends_cancelled_with_its_unrun_requests_transient(
        anthropic_server: AnthropicBatchServer) -> None:
    """Cancelled while in progress: ``cancelling``, then ``cancelled`` once it ended; the
    requests it did not run are results that may succeed in another batch."""
    anthropic_server.polls_until_done = 3
    batches = client(anthropic_server)
    batch = created(batches, "key-c", 3)
    cancelling = batches.cancel(batch.id)
    assert (cancelling.status, cancelling.ended) == ("cancelling", False)
    done = batches.retrieve(batch.id)
    assert (done.status, done.ended) == ("cancelled", True)
    results = list(batches.results(done))
    assert len(results) == 3 and all(r.transient for r in results if r.generation is None)
    assert any(r.generation is None and "canceled" in (r.error or "") for r in results)


def test_an_expired_batch_ends_expired_with_only_the_answers_it_has(
        anthropic_server: AnthropicBatchServer) -> None:
    """It ran one of three requests before it expired: one answer, two transient results."""
    anthropic_server.expire_after = 1
    batches = client(anthropic_server)
    done = ended(batches, created(batches, "key-x", 3))
    assert done.status == "expired"
    results = list(batches.results(done))
    assert sum(r.generation is not None for r in results) == 1
    assert [r.transient for r in results if r.generation is None] == [True, True]


def test_find_offers_the_batches_created_since_with_as_many_requests_oldest_first(
        anthropic_server: AnthropicBatchServer) -> None:
    """Anthropic's batches carry no key: those created since the intent with the same count
    are offered, oldest first; one of another size or created before is not."""
    batches = client(anthropic_server)
    since = datetime.now(UTC) - timedelta(seconds=30)
    first, _, third = (created(batches, "k1", 2), created(batches, "k2", 1),
                       created(batches, "k3", 2))
    assert [b.id for b in batches.find(Sought("k", 2, since))] == [first.id, third.id]
    later = datetime.now(UTC) + timedelta(minutes=5)
    assert batches.find(Sought("k", 2, later)) == []


def test_no_requests_or_a_custom_id_twice_is_refused_before_anything_is_sent(
        anthropic_server: AnthropicBatchServer) -> None:
    """Both are refused as invalid requests, naming the batch; the provider saw nothing."""
    batches = client(anthropic_server)
    body = batches.line(request(0))
    with pytest.raises(InvalidModelRequest, match="batch k must have 1 to"):
        batches.create("k", INLINE, [])
    with pytest.raises(InvalidModelRequest, match="names a custom_id twice"):
        batches.create("k", INLINE, [("c0", body), ("c0", body)])
    assert anthropic_server.requests == []


# --- a tick through an Anthropic endpoint, on both ledgers -----------------------------------


@pytest.fixture
def selected(env: Env, anthropic_server: AnthropicBatchServer) -> AnthropicBatchServer:
    """The server, selected through RUNLEDGER_MODEL=anthropic, with prices in USD."""
    env.set(model="anthropic", model_base_url=anthropic_server.base_url,
            model_name="probe-model", model_api_key="sk-ant", model_prices=json.dumps(PRICES),
            model_currency="USD", batch_lease_seconds=30)
    return anthropic_server


def settle() -> SettleReport:
    """One settle-batches flow run's report."""
    report = final_state(settle_batches(return_state=True)).result(raise_on_failure=False)
    assert isinstance(report, SettleReport), report
    return report


def statuses(env: Env, job: str) -> Counter[str]:
    return Counter(r.status for r in env.ledger.runs(job=job))


def messages_sent(server: AnthropicBatchServer) -> int:
    """How many synchronous messages the provider was sent."""
    return server.requests.count(("POST", "/v1/messages"))


def test_an_anthropic_batch_tick_is_created_once_and_settled_at_the_batch_price(
        env: Env, selected: AnthropicBatchServer) -> None:
    """Three subjects: one batch of three requests, no message sent synchronously, the Runs
    waiting, the tick Paused; a poll settles each answer at half the synchronous price and
    completes the Runs, each call answered once."""
    probe = probe_job(["a", "b", "c"], batch=True)
    state, _ = env.run(probe.name, None, PERIOD)
    assert state.is_paused(), state
    assert len(selected.created) == 1 and messages_sent(selected) == 0
    assert statuses(env, probe.name) == {"waiting": 3}
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert (batch.kind, batch.provider_file_id, batch.provider_batch_id) == (
        "anthropic", INLINE, selected.created[0])
    [polled] = settle().polled
    assert (polled.action, polled.provider_status, polled.settled) == ("settled", "completed", 3)
    assert statuses(env, probe.name) == {"completed": 3}
    calls = env.calls()
    assert Counter(c["outcome"] for c in calls) == {"answered": 3}
    assert {(c["cost_nanos"], c["sync_cost_nanos"]) for c in calls} == {
        (SYNC_COST_NANOS // 2, SYNC_COST_NANOS)}
    assert set(selected.creates_by_requests.values()) == {1}


def test_a_lost_anthropic_create_is_found_by_its_time_and_size_not_another_batchs(
        env: Env, selected: AnthropicBatchServer) -> None:
    """A first tick's batch of two is created and stored; a second tick's create of two is
    made and its reply lost: of the two batches created since its intent, the submitter takes
    the one no batch of the ledger names, and creates nothing more; both ticks complete."""
    first = probe_job(["a", "b"], batch=True)
    env.run(first.name, None, PERIOD)
    selected.drop_after_create = 1
    second = probe_job(["c", "d"], batch=True)
    state, _ = env.run(second.name, None, PERIOD)
    assert state.is_paused(), state
    assert len(selected.created) == 2
    stored = {b.job: b.provider_batch_id for b in env.ledger.batches.list_batches(limit=10)}
    assert stored == {first.name: selected.created[0], second.name: selected.created[1]}
    settle()
    assert statuses(env, first.name) == statuses(env, second.name) == {"completed": 2}
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": 4}


def test_an_anthropic_batch_past_its_deadline_is_cancelled_and_finished_synchronously(
        env: Env, selected: AnthropicBatchServer) -> None:
    """The provider still at work past the deadline: the poll cancels the batch (Anthropic's
    ``canceling``); the next finds it ended, withdraws the requests it did not run and sends
    them as synchronous messages, once each; every Run completed."""
    env.set(batch_deadline_seconds=0.001)
    selected.polls_until_done = 10
    probe = probe_job(["a", "b"], batch=True)
    env.run(probe.name, None, PERIOD)
    assert [(p.action, p.provider_status) for p in settle().polled] == [
        ("cancelling", "cancelling")]
    assert ("POST", f"/v1/messages/batches/{selected.created[0]}/cancel") in selected.requests
    [polled] = settle().polled
    assert (polled.provider_status, polled.withdrawn) == ("cancelled", 2)
    assert statuses(env, probe.name) == {"completed": 2}
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": 2, "withdrawn": 2}
    assert messages_sent(selected) == 2 and len(selected.created) == 1


def test_an_errored_request_fails_its_run_alone_and_an_overloaded_one_is_sent_again(
        env: Env, selected: AnthropicBatchServer) -> None:
    """invalid_request_error fails its Run with the provider's words; overloaded_error (529)
    may pass: its call goes into a new batch, whose answer completes its Run."""
    selected.polls_until_done = 1  # its requests run at the poll, after the errors are set
    probe = probe_job(["a", "b", "c"], batch=True)
    env.run(probe.name, None, PERIOD)
    ids = {c["subject"]: c["custom_id"] for c in env.calls()}
    selected.line_errors[ids["a"]] = (400, "the prompt is too long")
    selected.line_errors[ids["b"]] = (529, "overloaded")
    settle()
    [polled] = settle().polled
    # Settled: a's refusal and c's answer; b's transient error leaves its call queued.
    assert (polled.settled, polled.requeued, len(polled.resubmitted)) == (2, 1, 1)
    selected.line_errors.clear()
    settle()
    settle()
    runs = {r.subject: r for r in env.ledger.runs(job=probe.name)}
    assert runs["a"].status == "failed" and "too long" in (runs["a"].error or "")
    assert (runs["b"].status, runs["c"].status) == ("completed", "completed")
    assert len(selected.created) == 2


def test_a_tick_whose_create_would_be_a_second_in_doubt_leaves_its_batch_to_the_poll(
        env: Env, selected: AnthropicBatchServer) -> None:
    """A first tick's create fails with a 500 (it may have made a batch: its create is in
    doubt); a second tick creates nothing and gives its batch's lease back; the poll finds no
    batch for the first, creates it, then creates the second: one create each, every Run
    completed."""
    env.set(batch_lease_seconds=1)
    selected.refuse_creates = [(500, "internal error")]
    first = probe_job(["a", "b"], batch=True)
    env.run(first.name, None, PERIOD)
    second = probe_job(["c"], batch=True)
    state, _ = env.run(second.name, None, PERIOD)
    assert state.is_paused(), state
    assert selected.created == []
    opened = {b.job: b for b in env.ledger.batches.list_batches(limit=10)}
    assert (opened[first.name].provider_file_id, opened[second.name].provider_file_id) == (
        INLINE, None)
    assert {b.status for b in opened.values()} == {"open"}

    def completed() -> bool:
        settle()
        return statuses(env, first.name) == {"completed": 2} and \
            statuses(env, second.name) == {"completed": 1}

    wait_until(completed, 120, "both ticks' Runs completed by polls")
    assert len(selected.created) == 2 and set(selected.creates_by_requests.values()) == {1}
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": 3}


def test_a_create_the_provider_refused_holds_no_other_batch_back(
        env: Env, selected: AnthropicBatchServer) -> None:
    """A 400 to a tick's create made no batch: its create is not in doubt, so a second tick's
    batch is created at once; the first's stays open for a later poll."""
    selected.refuse_creates = [(400, "requests.0.params: bad")]
    first = probe_job(["a"], batch=True)
    env.run(first.name, None, PERIOD)
    [refused] = env.ledger.batches.list_batches(limit=10)
    assert (refused.status, refused.provider_file_id) == ("open", None)
    second = probe_job(["b"], batch=True)
    env.run(second.name, None, PERIOD)
    assert len(selected.created) == 1
    stored = {b.job: b.provider_batch_id for b in env.ledger.batches.list_batches(limit=10)}
    assert stored == {first.name: None, second.name: selected.created[0]}


def test_a_batch_taken_over_before_its_file_id_was_stored_never_adopts_another_batch(
        env: Env, selected: AnthropicBatchServer) -> None:
    """A batch's create is sent only after its file id is stored: a poll that takes over a
    batch without one (here: its create refused) creates it, and leaves alone a batch of the
    same size that another program created since its intent."""
    env.set(batch_lease_seconds=1)
    selected.refuse_creates = [(400, "requests.0.params: bad")]
    probe = probe_job(["a"], batch=True)
    env.run(probe.name, None, PERIOD)
    foreign = created(client(selected), "foreign", 1)

    def stored() -> bool:
        settle()
        [batch] = env.ledger.batches.list_batches(limit=10)
        return batch.provider_batch_id is not None

    wait_until(stored, 60, "a poll to take the batch over and create it")
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert selected.created == [foreign.id, batch.provider_batch_id]


@pytest.mark.parametrize(("refusal", "looked_for"), [((500, "internal error"), True),
                                                      ((400, "requests.0.params: bad"), False)])
def test_a_batch_never_created_by_its_deadline_is_withdrawn_not_created(
        env: Env, selected: AnthropicBatchServer, refusal: tuple[int, str],
        looked_for: bool) -> None:
    """The create failed and the deadline is near: the poll creates nothing; a create that
    may have been made (a 500) is looked for first, a refused one (a 400) is not; its calls
    are withdrawn and sent as synchronous messages, once each."""
    env.set(batch_lease_seconds=1, batch_deadline_seconds=0.001)
    selected.refuse_creates = [refusal]
    probe = probe_job(["a", "b"], batch=True)
    env.run(probe.name, None, PERIOD)
    listed = selected.requests.count(("GET", "/v1/messages/batches"))

    def finished() -> bool:
        settle()
        return statuses(env, probe.name) == {"completed": 2}

    wait_until(finished, 60, "the Runs of the batch never created completed by polls")
    assert selected.created == [] and messages_sent(selected) == 2
    looked = selected.requests.count(("GET", "/v1/messages/batches")) > listed
    assert looked is looked_for
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert (batch.status, batch.provider_status, batch.withdrawn) == (
        "settled", "not created", 2)


def test_a_poll_holds_a_batch_back_while_another_create_is_in_doubt_and_completes(
        env: Env, selected: AnthropicBatchServer) -> None:
    """While a first batch's create is in doubt (its holder's lease still running), the poll
    creates no second batch: it reports the second ``held back`` and ends Completed, not
    Failed (the next poll creates it)."""
    env.set(batch_lease_seconds=3600)
    selected.refuse_creates = [(500, "internal error")]
    env.run(probe_job(["a"], batch=True).name, None, PERIOD)
    second = probe_job(["b"], batch=True)
    env.run(second.name, None, PERIOD)
    state = final_state(settle_batches(return_state=True))
    report = state.result(raise_on_failure=False)
    assert state.is_completed(), state
    assert isinstance(report, SettleReport)
    assert [(p.job, p.action) for p in report.polled] == [(second.name, "held back")]
    assert selected.created == []
