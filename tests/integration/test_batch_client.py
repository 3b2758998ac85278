"""The OpenAI batch client (the official SDK) against OpenAI's Files and Batches API on
loopback: lines as the synchronous client sends its requests, a batch submitted and its
results read (structured output that validates, usage), a batch whose create got no reply found
by its key and never created twice, an expired or cancelled batch with only the results it has,
per-line errors transient or permanent, a refusal kept as an answer, the list paged through,
and the provider's failures naming what failed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from bench.batch_provider import BatchServer
from flows.model import (
    InvalidModelRequest,
    Message,
    ModelRejected,
    ModelUnavailable,
    Parameters,
    Request,
)
from flows.model.batch import BATCH_KEY, RemoteBatch, ResultLine, Sought
from flows.model.batch.openai import OpenAIBatchClient
from flows.model.openai_compatible import OpenAICompatibleModel
from tests.support.pipeline import ModelServer


class Launch(BaseModel):
    name: str


class Briefing(BaseModel):
    summary: str
    launches: list[Launch]


def client(server: BatchServer, **options: Any) -> OpenAIBatchClient:
    return OpenAIBatchClient(server.base_url, "probe-model", SecretStr("sk-batch"),
                             timeout_seconds=5, **options)


def request(n: int, output: type[BaseModel] | None = None) -> Request:
    return Request((Message("system", "Summarize."), Message("user", f"news {n}")),
                   output=output)


def submitted(batches: OpenAIBatchClient, key: str, count: int,
              output: type[BaseModel] | None = None) -> RemoteBatch:
    """A batch of ``count`` lines c0, c1... created under ``key``."""
    lines = [(f"c{n}", batches.line(request(n, output))) for n in range(count)]
    return batches.create(key, batches.upload(key, lines), lines)


def sought(key: str) -> Sought:
    """A batch of one request, its intent committed a minute ago."""
    return Sought(key, 1, datetime.now(UTC) - timedelta(minutes=1))


def by_id(results: list[ResultLine]) -> dict[str, ResultLine]:
    return {line.custom_id: line for line in results}


def test_a_batch_line_is_the_request_the_synchronous_client_sends(
        server: ModelServer, batch_server: BatchServer) -> None:
    """The same request, body and all (model, messages, max_tokens, temperature, the request's
    parameters, the strict JSON schema), whether it is sent now or in a batch line."""
    asked = Request((Message("system", "Summarize."), Message("user", "news")),
                    Parameters(top_p=0.5, seed=7, stop=("END",)), output=Briefing)
    OpenAICompatibleModel(server.base_url, "probe-model", temperature=0.2,
                          max_tokens=300).complete(asked)
    line = client(batch_server, temperature=0.2, max_tokens=300).line(asked)
    assert line == server.requests[0]["json"]
    assert line["response_format"]["json_schema"]["strict"] is True


def test_a_submitted_batch_gives_each_line_its_answer(batch_server: BatchServer) -> None:
    """The file holds one POST /v1/chat/completions line per custom_id; the batch carries our
    key in its metadata; each result line is an answer whose structured output validates, with
    the usage the provider reported."""
    batches = client(batch_server)
    batch = submitted(batches, "key-answers", 3, Briefing)
    assert (batch.ended, batch.status, batch.key, batch.total) == (
        True, "completed", "key-answers", 3)
    uploaded = batch_server.files[batch_server.batches[batch.id].input_file_id]
    lines = [json.loads(raw) for raw in uploaded.data.splitlines()]
    assert [(x["custom_id"], x["method"], x["url"]) for x in lines] == [
        (f"c{n}", "POST", "/v1/chat/completions") for n in range(3)]
    assert lines[1]["body"]["messages"][1] == {"role": "user", "content": "news 1"}
    results = list(batches.results(batch))
    assert sorted(line.custom_id for line in results) == ["c0", "c1", "c2"]
    for line in results:
        assert line.generation is not None and line.error is None and line.status == 200
        assert Briefing.model_validate_json(line.generation.text).summary.startswith("answer")
        assert (line.generation.model, line.generation.prompt_tokens,
                line.generation.completion_tokens) == ("probe-model", 100, 20)


def test_a_batch_polled_is_in_progress_until_it_ends(batch_server: BatchServer) -> None:
    """``polls_until_done`` retrieves answer in_progress (not ended, no files), then the batch
    is completed with all its results."""
    batch_server.polls_until_done = 2
    batches = client(batch_server)
    batch = submitted(batches, "key-polled", 4)
    assert not batch.ended
    seen = [batches.retrieve(batch.id) for _ in range(3)]
    assert [(b.status, b.ended) for b in seen] == [
        ("in_progress", False), ("in_progress", False), ("completed", True)]
    assert seen[0].output_file_id is None
    assert len(list(batches.results(seen[-1]))) == 4


def test_a_create_without_a_reply_is_found_by_its_key_never_created_twice(
        batch_server: BatchServer) -> None:
    """The batch was created and the connection dropped: the create fails as transient, and
    the batch is found by the key in its metadata (among others): one batch for the key."""
    batches = client(batch_server)
    submitted(batches, "key-other-1", 1)
    batch_server.drop_after_create = 1
    lines = [("c0", batches.line(request(0)))]
    file_id = batches.upload("key-dropped", lines)
    with pytest.raises(ModelUnavailable, match=r"batches\.create of batch key-dropped"):
        batches.create("key-dropped", file_id, lines)
    submitted(batches, "key-other-2", 1)
    [found] = batches.find(sought("key-dropped"))
    assert batch_server.creates_by_key["key-dropped"] == 1
    assert (found.id, found.metadata[BATCH_KEY]) == (batch_server.created[1], "key-dropped")
    assert batches.find(sought("key-never-created")) == []


def test_find_pages_through_more_batches_than_a_page_newest_first(
        batch_server: BatchServer) -> None:
    """The key's batch is past the first page of 100: found; with two batches under one key,
    the newest is the one found."""
    batches = client(batch_server)
    lines = [("c0", batches.line(request(0)))]
    file_id = batches.upload("key-pages", lines)
    first = batches.create("key-old", file_id, lines)
    for n in range(100):
        batches.create(f"key-{n}", file_id, lines)
    [found] = batches.find(sought("key-old"))
    assert found.id == first.id
    assert batch_server.requests.count(("GET", "/v1/batches")) == 2
    again = batches.create("key-7", file_id, lines)
    [newest] = batches.find(sought("key-7"))
    assert newest.id == again.id


def test_an_expired_batch_yields_only_the_results_it_has(batch_server: BatchServer) -> None:
    """The batch ended expired with 2 of its 5 lines run: those are answers; the others are
    transient error lines (batch_expired), to be asked again in another batch."""
    batch_server.expire_after = 2
    batch_server.polls_until_done = 1
    batches = client(batch_server)
    batch = batches.retrieve(submitted(batches, "key-expired", 5).id)
    assert not batch.ended
    batch = batches.retrieve(batch.id)
    assert (batch.status, batch.ended) == ("expired", True)
    results = by_id(list(batches.results(batch)))
    answered = sorted(k for k, line in results.items() if line.generation is not None)
    assert answered == ["c0", "c1"]
    for custom_id in ("c2", "c3", "c4"):
        line = results[custom_id]
        assert (line.generation, line.status, line.transient) == (None, None, True)
        assert line.error is not None and "batch_expired" in line.error


@pytest.mark.parametrize("status, transient", [
    (429, True), (500, True), (503, True), (408, True), (400, False), (404, False),
    (422, False)])
def test_a_line_error_is_transient_or_permanent_by_its_status(
        batch_server: BatchServer, status: int, transient: bool) -> None:
    """A line answered with an error status: 408, 429 and 5xx may succeed in another batch,
    other 4xx never; the line carries its status and the provider's message; the other
    lines are answers."""
    batch_server.line_errors = {"c1": (status, f"scripted {status}")}
    batches = client(batch_server)
    batch = submitted(batches, "key-line-errors", 3)
    assert (batch.completed, batch.failed) == (2, 1)
    results = by_id(list(batches.results(batch)))
    failed = results["c1"]
    assert (failed.generation, failed.status, failed.transient) == (None, status, transient)
    assert failed.error is not None and f"HTTP {status}: scripted {status}" in failed.error
    assert results["c0"].generation is not None and results["c2"].generation is not None


def test_a_refusal_is_an_answer_that_keeps_the_refusal(batch_server: BatchServer) -> None:
    """A line whose completion is the model's refusal (no content) is an answer (paid) with
    ``Generation.refusal``, not an error."""
    def refusing(body: dict[str, Any]) -> dict[str, Any]:
        completion = batch_server.chat_completion(body)
        completion["choices"][0]["message"] = {"role": "assistant", "content": None,
                                               "refusal": "I can't help with that."}
        return completion

    batch_server.completion = refusing
    batches = client(batch_server)
    [line] = batches.results(submitted(batches, "key-refused", 1, Briefing))
    assert line.error is None and line.generation is not None
    assert (line.generation.refusal, line.generation.text) == ("I can't help with that.", "")
    assert line.generation.completion_tokens == 20


def test_a_malformed_completion_is_a_permanent_line_error(batch_server: BatchServer) -> None:
    """A 200 line without choices cannot be read as an answer: a permanent error for that
    line, never an exception for the whole batch."""
    batch_server.completion = lambda body: {"model": body["model"], "choices": []}
    batches = client(batch_server)
    [line] = batches.results(submitted(batches, "key-malformed", 1))
    assert (line.generation, line.status, line.transient) == (None, 200, False)
    assert line.error is not None and "malformed" in line.error


def test_a_cancelled_batch_ends_with_the_results_done_so_far(batch_server: BatchServer) -> None:
    """Cancelled after a quarter of its lines ran: cancelling (not ended), then cancelled with
    those answers; the lines never run are transient (batch_cancelled)."""
    batch_server.polls_until_done = 3
    batches = client(batch_server)
    batch = submitted(batches, "key-cancelled", 8)
    assert batches.retrieve(batch.id).completed == 2
    cancelling = batches.cancel(batch.id)
    assert (cancelling.status, cancelling.ended) == ("cancelling", False)
    ended = batches.retrieve(batch.id)
    assert (ended.status, ended.ended) == ("cancelled", True)
    results = by_id(list(batches.results(ended)))
    assert sorted(k for k, line in results.items() if line.generation is not None) == [
        "c0", "c1"]
    assert all(line.transient and line.error is not None and "batch_cancelled" in line.error
               for k, line in results.items() if k not in ("c0", "c1"))
    with pytest.raises(ModelRejected, match=r"batches\.cancel of .*HTTP 409"):
        batches.cancel(batch.id)


def test_a_batch_whose_file_fails_validation_ends_failed_saying_why(
        batch_server: BatchServer) -> None:
    """A file the provider cannot read fails the whole batch: ended, no results, the
    provider's reason and line in ``error``."""
    batches = client(batch_server)
    uploaded = batches.model.sdk.files.create(file=("bad.jsonl", b"not json\n"),
                                              purpose="batch")
    batch = batches.create("key-bad-file", uploaded.id, [])
    assert (batch.status, batch.ended, batch.output_file_id) == ("failed", True, None)
    assert batch.error is not None and "(line 1)" in batch.error
    assert list(batches.results(batch)) == []


def test_lines_that_cannot_make_a_batch_are_refused_before_anything_is_sent(
        batch_server: BatchServer) -> None:
    """No line, more lines than ``max_requests`` or a custom_id twice: refused, no upload."""
    batches = client(batch_server, max_requests=2)
    body = batches.line(request(0))
    for lines in ([], [("a", body), ("b", body), ("c", body)], [("a", body), ("a", body)]):
        with pytest.raises(InvalidModelRequest):
            batches.upload("key-refused-lines", lines)
    assert batch_server.requests == []


def test_the_providers_failures_name_it_and_what_failed(batch_server: BatchServer) -> None:
    """A 404 is permanent and names the call and the batch; a provider gone down is
    transient (unreachable)."""
    batches = client(batch_server)
    with pytest.raises(ModelRejected, match=r"batches\.retrieve of batch-missing.*HTTP 404"):
        batches.retrieve("batch-missing")
    batch_server.stop()
    with pytest.raises(ModelUnavailable, match=rf"{batches.base_url} \(batches\.list .*"
                                               r"unreachable"):
        batches.find(sought("key-any"))
