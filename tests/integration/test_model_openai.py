"""The OpenAI-compatible client against a real HTTP server on loopback: answers, 429 with
Retry-After, 5xx, 4xx, malformed and slow replies; and the call log across processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from flows.model import (
    CallLog,
    ModelRejected,
    ModelUnavailable,
    OpenAICompatibleModel,
    model_from_settings,
)
from flows.settings import RunledgerSettings
from tests.integration.pipeline_support import ModelServer, Reply

KEY = "sk-test-secret-123"


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as running:
        yield running


def client(server: ModelServer, timeout: float = 5.0) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(server.base_url, "probe-model", SecretStr(KEY),
                                 timeout_seconds=timeout)


def test_an_answer_is_returned_with_the_model_name(server: ModelServer) -> None:
    """The request carries the model, the system and user messages and the bearer key."""
    server.script.append(Reply(text="  Globex cut prices.  "))
    answer = client(server).generate("documents", system="Summarize.")
    assert (answer.text, answer.model) == ("Globex cut prices.", "probe-model")
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {KEY}"
    assert request["json"]["model"] == "probe-model"
    assert request["json"]["messages"] == [{"role": "system", "content": "Summarize."},
                                           {"role": "user", "content": "documents"}]


def test_a_rate_limit_is_transient_and_carries_retry_after(server: ModelServer) -> None:
    """HTTP 429 with Retry-After: retry later, after that many seconds."""
    server.script.append(Reply(429, headers={"Retry-After": "3"}))
    with pytest.raises(ModelUnavailable, match="HTTP 429") as caught:
        client(server).generate("x")
    assert caught.value.retry_after == 3.0


def test_a_server_error_is_transient(server: ModelServer) -> None:
    """HTTP 500 and 503 are retried."""
    server.script.extend([Reply(500), Reply(503)])
    for _ in range(2):
        with pytest.raises(ModelUnavailable, match="HTTP 5"):
            client(server).generate("x")


def test_a_slow_reply_times_out_as_transient(server: ModelServer) -> None:
    """A reply slower than the timeout is a transient failure naming the timeout."""
    server.script.append(Reply(delay=2.0))
    with pytest.raises(ModelUnavailable, match=r"did not answer within 0\.3 s"):
        client(server, timeout=0.3).generate("x")


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
    model.generate("x")
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-from-block"


def test_the_call_log_keeps_every_line_whole_across_processes(tmp_path: Path) -> None:
    """Four processes appending 200 calls each at once leave 800 parseable lines."""
    path = tmp_path / "calls.jsonl"
    code = (
        "import sys; from pathlib import Path; from flows.model import CallLog\n"
        "log = CallLog(Path(sys.argv[1]))\n"
        "for i in range(200): log.record('job', 's' * 500, str(i))\n"
    )
    workers = [subprocess.Popen([sys.executable, "-c", code, str(path)]) for _ in range(4)]
    assert [w.wait(timeout=60) for w in workers] == [0, 0, 0, 0]
    entries = CallLog(path).entries()
    assert len(entries) == 800
    assert len({e["pid"] for e in entries}) == 4
