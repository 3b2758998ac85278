"""The Anthropic client (the official ``anthropic`` SDK) against an Anthropic-compatible
Messages API on loopback: answers with their usage (cache reads and writes), structured output
through a forced tool, refusals, prompt caching, rate-limit headers, and its error replies
(429 with retry-after, 529, 400)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from flows.errors import NotReady
from flows.model import (
    ModelMisconfigured,
    ModelRejected,
    ModelUnavailable,
    endpoint_named,
    model_from_settings,
)
from flows.model.anthropic import AnthropicModel
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.model.request import Message, Parameters, Request
from flows.run_job.preflight import preflight
from flows.settings import RunledgerSettings
from tests.support.anthropic_server import AnthropicServer, Reply
from tests.support.pipeline import probe_job

KEY = "sk-ant-test-secret-123"


class Launches(BaseModel):
    summary: str
    launches: list[str]


@pytest.fixture
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer() as running:
        yield running


def client(server: AnthropicServer, **options: object) -> AnthropicModel:
    return AnthropicModel(server.base_url, "claude-probe", SecretStr(KEY), timeout_seconds=5.0,
                          **options)  # type: ignore[arg-type]


def ask(*messages: Message, **parameters: object) -> Request:
    return Request(messages or (Message("user", "documents"),),
                   Parameters(**parameters))  # type: ignore[arg-type]


def sent(server: AnthropicServer, n: int = 0) -> dict[str, object]:
    body: dict[str, object] = server.requests[n]["json"]
    return body


def test_an_answer_is_returned_with_the_model_name_and_usage(server: AnthropicServer) -> None:
    """The request carries the model, the system text apart from the turns, the key (as the
    SDK sends it) and the endpoint's max_tokens; the answer carries the text and usage."""
    server.script.append(Reply(text="  Globex cut prices.  "))
    answer = client(server).complete(ask(Message("system", "Summarize."),
                                         Message("user", "documents")))
    assert (answer.text, answer.model) == ("Globex cut prices.", "claude-probe")
    assert (answer.prompt_tokens, answer.completion_tokens) == (100, 30)
    assert (answer.cached_tokens, answer.cache_write_tokens, answer.refusal) == (None, None, None)
    request = server.requests[0]
    assert request["path"] == "/v1/messages"
    assert {k.lower(): v for k, v in request["headers"].items()}["authorization"] == (
        f"Bearer {KEY}")
    assert sent(server)["system"] == [{"type": "text", "text": "Summarize."}]
    assert sent(server)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "documents"}]}]
    assert sent(server)["max_tokens"] == 1024


def test_max_tokens_is_always_sent_the_requests_else_the_endpoints(
        server: AnthropicServer) -> None:
    """Anthropic requires max_tokens: the request's when it sets one, else the endpoint's;
    the parameters set are sent under Anthropic's names (stop as stop_sequences)."""
    model = client(server, max_tokens=77)
    model.complete(ask())
    model.complete(ask(max_tokens=12, temperature=0.2, top_p=0.9, stop=("END",)))
    assert [sent(server, n)["max_tokens"] for n in (0, 1)] == [77, 12]
    second = sent(server, 1)
    assert (second["temperature"], second["top_p"], second["stop_sequences"]) == (
        0.2, 0.9, ["END"])
    assert "temperature" not in sent(server, 0)


def test_structured_output_is_asked_through_a_forced_tool(server: AnthropicServer) -> None:
    """An output model becomes the one tool, forced, with the model's JSON schema as its
    input schema; the tool's input comes back as the answer's JSON text, which validates."""
    server.script.append(Reply(tool={"summary": "Globex cut prices", "launches": ["X1"]}))
    answer = client(server).complete(Request((Message("user", "documents"),),
                                             output=Launches))
    assert Launches.model_validate_json(answer.text) == Launches(
        summary="Globex cut prices", launches=["X1"])
    body = sent(server)
    assert body["tools"] == [{"name": "Launches", "input_schema": Launches.model_json_schema(),
                              "description": "Answer with a Launches."}]
    assert body["tool_choice"] == {"type": "tool", "name": "Launches"}


def test_an_answer_that_does_not_fit_the_schema_is_returned_as_it_came(
        server: AnthropicServer) -> None:
    """The client does not validate: the tool's input, whatever it is, is the answer's text
    (validation, and its evidence, belong to the caller)."""
    server.script.append(Reply(tool={"summary": 3}))
    answer = client(server).complete(Request((Message("user", "documents"),),
                                             output=Launches))
    assert json.loads(answer.text) == {"summary": 3}


def test_a_refusal_is_an_answer_with_its_refusal(server: AnthropicServer) -> None:
    """stop_reason refusal: the call was paid, so it is an answer whose ``refusal`` says so,
    with its usage; never an error."""
    server.script.extend([Reply(text="I can't help with that.", stop_reason="refusal"),
                          Reply(text="", stop_reason="refusal")])
    answer = client(server).complete(ask())
    assert answer.refusal == "I can't help with that."
    assert (answer.prompt_tokens, answer.completion_tokens) == (100, 30)
    assert client(server).complete(ask()).refusal == "the model refused to answer (stop_reason refusal)"


def test_usage_counts_cache_reads_and_writes_in_the_prompt(server: AnthropicServer) -> None:
    """input_tokens are the uncached ones: the prompt's total adds the cache reads and
    writes, reported apart as cached_tokens and cache_write_tokens."""
    server.script.append(Reply(usage={"input_tokens": 50, "output_tokens": 20,
                                      "cache_read_input_tokens": 900,
                                      "cache_creation_input_tokens": 300}))
    answer = client(server).complete(ask())
    assert (answer.prompt_tokens, answer.completion_tokens) == (1250, 20)
    assert (answer.cached_tokens, answer.cache_write_tokens) == (900, 300)


def test_a_cached_message_carries_cache_control_on_its_last_block(
        server: AnthropicServer) -> None:
    """cache=True marks a prompt-cache breakpoint: cache_control ephemeral on that message's
    content block (system or turn); other messages carry none."""
    client(server).complete(ask(Message("system", "Long instructions.", cache=True),
                                Message("user", "Shared documents.", cache=True),
                                Message("assistant", "Noted."),
                                Message("user", "Today's question.")))
    body = sent(server)
    assert body["system"] == [{"type": "text", "text": "Long instructions.",
                               "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Shared documents.",
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
        {"role": "user", "content": [{"type": "text", "text": "Today's question."}]}]


def test_the_limits_its_headers_announce_come_with_the_answer(server: AnthropicServer) -> None:
    """anthropic-ratelimit-* headers (reset as RFC 3339) are parsed into ``announced``; an
    answer without them announces nothing."""
    reset = (datetime.now(UTC) + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    server.script.extend([Reply(headers={
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000"}), Reply()])
    announced = client(server).complete(ask()).announced
    assert announced is not None
    assert (announced.requests.limit, announced.requests.remaining) == (50, 49)
    assert announced.requests.reset_seconds is not None
    assert 20 < announced.requests.reset_seconds <= 30
    assert (announced.input_tokens.limit, announced.input_tokens.remaining) == (40000, 39000)
    assert client(server).complete(ask()).announced is None


def test_a_rate_limit_is_rate_limited_and_carries_retry_after(server: AnthropicServer) -> None:
    """HTTP 429 (rate_limit_error) with retry-after: the endpoint pauses that long, and the
    call is a refusal (not billed); the SDK did not retry it."""
    server.script.append(Reply(429, headers={"retry-after": "7"}))
    with pytest.raises(ModelUnavailable, match=r"HTTP 429.*rate_limit_error") as caught:
        client(server).complete(ask())
    assert (caught.value.rate_limited, caught.value.retry_after, caught.value.status) == (
        True, 7.0, 429)
    assert len(server.requests) == 1


def test_an_overloaded_endpoint_is_transient(server: AnthropicServer) -> None:
    """HTTP 529 (overloaded_error) and 500 are transient, not rate limits: the stage retries."""
    server.script.extend([Reply(529), Reply(500)])
    for status in (529, 500):
        with pytest.raises(ModelUnavailable, match=f"HTTP {status}") as caught:
            client(server).complete(ask())
        assert (caught.value.rate_limited, caught.value.status) == (False, status)
    assert len(server.requests) == 2


def test_a_bad_request_is_permanent_and_never_shows_the_key(server: AnthropicServer) -> None:
    """HTTP 400 (invalid_request_error) and 401 are not retried; the error quotes the reply
    but not the API key."""
    server.script.extend([Reply(400), Reply(401)])
    for status in (400, 401):
        with pytest.raises(ModelRejected, match=f"HTTP {status}") as caught:
            client(server).complete(ask())
        assert KEY not in str(caught.value) and caught.value.status == status


def test_without_a_key_no_key_header_is_sent(server: AnthropicServer) -> None:
    """A local server needs no key: neither x-api-key nor Authorization is sent."""
    AnthropicModel(server.base_url, "claude-probe").complete(ask())
    sent_headers = {k.lower() for k in server.requests[0]["headers"]}
    assert "x-api-key" not in sent_headers and "authorization" not in sent_headers


def test_the_plain_call_is_a_request_of_its_prompt_and_system(server: AnthropicServer) -> None:
    """generate(prompt, system=...) asks what complete asks of those two messages."""
    answer = client(server).generate("documents", system="Summarize.")
    assert answer.text == "answer 1"
    assert sent(server)["system"] == [{"type": "text", "text": "Summarize."}]


def test_an_unreachable_server_is_transient() -> None:
    """Nothing listening: ModelUnavailable naming the address."""
    with pytest.raises(ModelUnavailable, match="unreachable"):
        AnthropicModel("http://127.0.0.1:9", "claude-probe").complete(ask())


def test_the_settings_select_the_anthropic_client(server: AnthropicServer) -> None:
    """RUNLEDGER_MODEL=anthropic builds this client; without a base URL it is a clear error."""
    model = model_from_settings(RunledgerSettings(
        model="anthropic", model_base_url=server.base_url, model_name="claude-probe"))
    assert isinstance(model, AnthropicModel)
    with pytest.raises(ModelMisconfigured, match="RUNLEDGER_MODEL=anthropic needs"):
        model_from_settings(RunledgerSettings(model="anthropic", model_name="claude-probe"))


@pytest.mark.parametrize(("entry", "problem"), [
    ({"kind": "anthropic", "base_url": "ftp://127.0.0.1/", "model_name": "claude-probe"},
     "endpoint claude's base_url must be an http(s) URL such as https://api.anthropic.com"),
    ({"kind": "anthropic", "base_url": "http://127.0.0.1:9", "model_name": ""},
     "endpoint claude's model_name must name the model of an anthropic endpoint"),
])
def test_a_bad_anthropic_endpoint_is_refused_before_any_run_is_registered(
        entry: dict[str, str], problem: str) -> None:
    """An anthropic endpoint whose base URL is not http(s), or without a model name: the
    tick's preflight refuses the job (NotReady), naming the setting, before anything is
    written."""
    settings = RunledgerSettings(endpoints={"claude": entry})
    with pytest.raises(ModelMisconfigured, match=re.escape(problem)):
        endpoint_named("claude", settings)
    with pytest.raises(NotReady, match=re.escape(problem)):
        preflight(probe_job(["acme"], endpoint="claude").job, settings, sends=False)


def test_an_unknown_endpoint_kind_is_refused_with_the_known_ones() -> None:
    """A kind other than openai or anthropic is a settings error naming both."""
    with pytest.raises(ValidationError, match="'openai' or 'anthropic'"):
        RunledgerSettings(endpoints={"x": {
            "kind": "gemini", "base_url": "http://127.0.0.1:9", "model_name": "m"}})


def test_the_endpoint_kind_chooses_the_client(server: AnthropicServer) -> None:
    """A RUNLEDGER_ENDPOINTS entry of kind anthropic builds the Anthropic client; of no kind,
    the OpenAI-compatible one."""
    settings = RunledgerSettings(endpoints={
        "claude": {"kind": "anthropic", "base_url": server.base_url, "model_name": "c"},
        "gpt": {"base_url": "http://127.0.0.1:9/v1", "model_name": "g"}})
    assert isinstance(endpoint_named("claude", settings).model(), AnthropicModel)
    assert isinstance(endpoint_named("gpt", settings).model(), OpenAICompatibleModel)
