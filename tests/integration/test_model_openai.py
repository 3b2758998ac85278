"""The OpenAI-compatible client (the official SDK) against a real HTTP server on loopback:
answers with their usage, 429 with Retry-After, 5xx, 4xx, malformed and slow replies; messages,
parameters and structured output as sent, refusals, cached tokens and announced limits."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, SecretStr

from flows.model import (
    Message,
    ModelRefused,
    ModelRejected,
    ModelUnavailable,
    Parameters,
    Request,
    model_from_settings,
)
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.settings import RunledgerSettings
from tests.support.pipeline import ModelServer, Reply

KEY = "sk-test-secret-123"


def client(server: ModelServer, timeout: float = 5.0) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(server.base_url, "probe-model", SecretStr(KEY),
                                 timeout_seconds=timeout)


def headers(server: ModelServer, n: int = 0) -> dict[str, str]:
    return {k.lower(): v for k, v in server.requests[n]["headers"].items()}


def test_an_answer_is_returned_with_the_model_name_and_usage(server: ModelServer) -> None:
    """The request carries the model, the system and user messages and the bearer key; the
    answer carries the tokens the server's ``usage`` field reported."""
    server.script.append(Reply(text="  Globex cut prices.  "))
    answer = client(server).generate("documents", system="Summarize.")
    assert (answer.text, answer.model) == ("Globex cut prices.", "probe-model")
    assert (answer.prompt_tokens, answer.completion_tokens) == (120, 30)
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert headers(server)["authorization"] == f"Bearer {KEY}"
    assert request["json"]["model"] == "probe-model"
    assert request["json"]["messages"] == [{"role": "system", "content": "Summarize."},
                                           {"role": "user", "content": "documents"}]


def test_every_request_asks_for_at_most_the_models_max_tokens(server: ModelServer) -> None:
    """The client's max_tokens (1024 unless given) is sent with every request."""
    client(server).generate("documents")
    OpenAICompatibleModel(server.base_url, "probe-model", max_tokens=77).generate("documents")
    assert [r["json"]["max_tokens"] for r in server.requests] == [1024, 77]


def test_a_server_without_usage_gives_an_answer_without_token_counts(server: ModelServer) -> None:
    """No ``usage`` field: the tokens are unknown (None), not zero."""
    server.script.append(Reply(text="ok", usage=None))
    answer = client(server).generate("x")
    assert (answer.prompt_tokens, answer.completion_tokens) == (None, None)


def test_without_a_key_no_authorization_header_is_sent(server: ModelServer) -> None:
    """A local server needs no key: the request carries no Authorization header at all."""
    OpenAICompatibleModel(server.base_url, "probe-model").generate("x")
    assert "authorization" not in headers(server)


def test_the_sdk_never_retries_by_itself(server: ModelServer) -> None:
    """One failing call is one request: the pipeline decides retries."""
    server.script.extend([Reply(503), Reply(503)])
    with pytest.raises(ModelUnavailable):
        client(server).generate("x")
    assert len(server.requests) == 1


def test_a_rate_limit_is_transient_and_carries_retry_after(server: ModelServer) -> None:
    """HTTP 429 with Retry-After: retry later, after that many seconds; the provider's status
    marks it a refusal (not billed)."""
    server.script.append(Reply(429, headers={"Retry-After": "3"}))
    with pytest.raises(ModelUnavailable, match="HTTP 429") as caught:
        client(server).generate("x")
    assert caught.value.retry_after == 3.0
    assert caught.value.status == 429


@pytest.mark.parametrize("status, given, pause, rate_limited", [
    (429, {"Retry-After": "3"}, 3.0, True),
    (429, {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}, 360.0, True),
    (429, {"Retry-After": "soon"}, None, True),
    (503, {"Retry-After": "2"}, 2.0, True),
    (503, {}, None, False),
    (500, {"Retry-After": "2"}, 2.0, False),
])
def test_a_rate_limit_names_the_pause_the_provider_asked_for(
        server: ModelServer, status: int, given: dict[str, str], pause: float | None,
        rate_limited: bool) -> None:
    """A 429, or a 503 naming a pause, asks every worker to slow down (rate_limited): its
    pause is the Retry-After, else the longest x-ratelimit-reset-*; garbage is no hint."""
    server.script.append(Reply(status, headers=given))
    with pytest.raises(ModelUnavailable) as caught:
        client(server).generate("x")
    assert (caught.value.retry_after, caught.value.rate_limited) == (pause, rate_limited)


def test_a_server_error_is_transient(server: ModelServer) -> None:
    """HTTP 500 and 503 are retried."""
    server.script.extend([Reply(500), Reply(503)])
    for _ in range(2):
        with pytest.raises(ModelUnavailable, match="HTTP 5"):
            client(server).generate("x")


def test_a_slow_reply_times_out_as_transient(server: ModelServer) -> None:
    """A reply slower than the timeout is a transient failure naming the timeout."""
    server.script.append(Reply(delay=2.0))
    with pytest.raises(ModelUnavailable, match=r"did not answer within 0\.3 s") as caught:
        client(server, timeout=0.3).generate("x")
    assert caught.value.status is None  # no reply: the provider may have billed it


def test_a_refused_request_is_permanent_and_never_shows_the_key(server: ModelServer) -> None:
    """HTTP 400/401 are not retried; the error quotes the reply but not the API key."""
    server.script.extend([Reply(400), Reply(401)])
    for status in ("400", "401"):
        with pytest.raises(ModelRejected, match=f"HTTP {status}") as caught:
            client(server).generate("x")
        assert KEY not in str(caught.value)


def test_a_malformed_reply_is_permanent(server: ModelServer) -> None:
    """A 200 without choices[0].message.content is refused."""
    server.script.extend([Reply(raw=b"not json"), Reply(raw=b'{"choices": []}')])
    for _ in range(2):
        with pytest.raises(ModelRejected, match="without choices"):
            client(server).generate("x")


def test_an_unreachable_server_is_transient(server: ModelServer) -> None:
    """A refused connection is retried."""
    model = client(server)
    server.stop()
    with pytest.raises(ModelUnavailable, match="unreachable"):
        model.generate("x")


def test_the_api_key_can_come_from_a_prefect_secret_block(server: ModelServer,
                                                          prefect_api: str) -> None:
    """RUNLEDGER_MODEL_API_KEY_BLOCK names a Prefect Secret block holding the key."""
    from prefect.blocks.system import Secret

    Secret(value="sk-from-block").save("runledger-test-model-key", overwrite=True)
    model = model_from_settings(RunledgerSettings(
        model="openai", model_base_url=server.base_url, model_name="probe-model",
        model_api_key_block="runledger-test-model-key",
    ))
    model.complete(Request((Message("user", "x"),)))
    assert headers(server)["authorization"] == "Bearer sk-from-block"


class Verdict(BaseModel):
    label: str
    score: int


def test_messages_and_parameters_reach_the_server_as_sent(server: ModelServer) -> None:
    """Every turn in order, and the request's parameters over the endpoint's max_tokens."""
    messages = (Message("system", "Classify."), Message("user", "first"),
                Message("assistant", "noted"), Message("user", "second"))
    client(server).complete(Request(messages, Parameters(
        temperature=0.2, max_tokens=64, top_p=0.9, seed=7, stop=("END",))))
    sent = server.requests[0]["json"]
    assert sent["messages"] == [{"role": m.role, "content": m.content} for m in messages]
    assert {k: sent[k] for k in ("temperature", "max_tokens", "top_p", "seed", "stop")} == {
        "temperature": 0.2, "max_tokens": 64, "top_p": 0.9, "seed": 7, "stop": ["END"]}
    assert "response_format" not in sent


def test_structured_output_asks_for_the_strict_json_schema_and_is_validated(
        server: ModelServer) -> None:
    """response_format is the SDK's strict JSON schema of the output model; the answer's JSON
    is validated into it (parsed); one that does not validate is ValidationFailed."""
    from flows.errors import ValidationFailed

    server.script.extend([Reply(text='{"label": "launch", "score": 3}'),
                          Reply(text='{"label": "launch"}')])
    answer = client(server).generate("x", output=Verdict)
    assert answer.parsed == Verdict(label="launch", score=3)
    schema = server.requests[0]["json"]["response_format"]["json_schema"]
    assert (schema["name"], schema["strict"], schema["schema"]["required"]) == (
        "Verdict", True, ["label", "score"])
    with pytest.raises(ValidationFailed, match=r"score: Field required"):
        client(server).generate("x", output=Verdict)


def test_a_refusal_is_an_answer_of_the_client_and_an_error_of_the_call(
        server: ModelServer) -> None:
    """complete returns the refusal with its usage (paid); generate raises ModelRefused."""
    server.script.extend([Reply(refusal="No."), Reply(refusal="No.")])
    answer = client(server).complete(Request((Message("user", "x"),), output=Verdict))
    assert (answer.refusal, answer.text, answer.prompt_tokens) == ("No.", "", 120)
    with pytest.raises(ModelRefused, match=r"refused to answer: No\."):
        client(server).generate("x", output=Verdict)


def test_cached_tokens_and_announced_limits_come_with_the_answer(server: ModelServer) -> None:
    """usage.prompt_tokens_details.cached_tokens, and the x-ratelimit-* headers read."""
    server.script.append(Reply(
        usage={"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
               "prompt_tokens_details": {"cached_tokens": 64}},
        headers={"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "599",
                 "x-ratelimit-reset-requests": "100ms"}))
    answer = client(server).generate("x")
    assert answer.cached_tokens == 64
    assert answer.announced is not None
    assert (answer.announced.requests.limit, answer.announced.requests.remaining) == (600, 599)
