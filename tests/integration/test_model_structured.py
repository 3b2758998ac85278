"""Structured output, messages and parameters through the recording wrapper, on both ledgers
against a real OpenAI-compatible server on loopback (the official SDK): an answer validated
into its pydantic model, one that does not validate and one the model refused (both paid,
kept as evidence, never replayed), a changed schema or temperature called again, and bad input
refused before anything is recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from flows.errors import ValidationFailed
from flows.model import (
    CallCount,
    InvalidModelRequest,
    Message,
    ModelRefused,
    OfflineModel,
    RecordedModel,
)
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.prices import PriceList
from store import Claim, Ledger, RunIdentity
from tests.support.ledger import claim_of, model_calls, wait_for_db_clock
from tests.support.pipeline import ModelServer, Reply

PERIOD = datetime(2026, 12, 3, tzinfo=UTC)


class Launch(BaseModel):
    name: str


class Briefing(BaseModel):
    summary: str
    launches: list[Launch]


class Briefing2(BaseModel):
    summary: str
    launches: list[Launch]
    risk: int


def claimed(ledger: Ledger, lease: timedelta = timedelta(minutes=15)) -> Claim:
    return claim_of(ledger, RunIdentity("structured", "acme", PERIOD, "v1"), lease=lease)


def recorded(server: ModelServer, ledger: Ledger, claim: Claim) -> RecordedModel:
    inner = OpenAICompatibleModel(server.base_url, "probe-model", timeout_seconds=5,
                                  max_tokens=500)
    return RecordedModel(inner, ledger.calls, claim, PriceList(), CallCount())


def reclaimed(ledger: Ledger, first: Claim, lease: timedelta = timedelta(minutes=15)) -> Claim:
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = ledger.claim(first.run_id, f"w:{first.fence + 1}", lease)
    assert second is not None
    return second


def test_structured_output_is_validated_into_the_output_model(
        server: ModelServer, ledger: Ledger) -> None:
    """The server answers a document of the strict schema it was sent: ``parsed`` is a
    Briefing, and the call is answered in the ledger."""
    answer = recorded(server, ledger, claimed(ledger)).generate("docs", output=Briefing)
    assert answer.parsed == Briefing(summary="answer 1", launches=[Launch(name="answer 1")])
    sent = server.requests[0]["json"]["response_format"]
    assert (sent["type"], sent["json_schema"]["name"], sent["json_schema"]["strict"]) == (
        "json_schema", "Briefing", True)
    assert sent["json_schema"]["schema"]["additionalProperties"] is False


def test_an_answer_that_does_not_validate_fails_and_stays_as_evidence(
        server: ModelServer, ledger: Ledger) -> None:
    """ValidationFailed quotes the raw answer; the paid call is answered, rejected, and the
    next attempt calls again instead of replaying it."""
    claim = claimed(ledger, lease=timedelta(seconds=1))
    server.script.append(Reply(text='{"summary": "x"}'))
    with pytest.raises(ValidationFailed, match=r'not a valid Briefing .*launches.*"summary": "x"'):
        recorded(server, ledger, claim).generate("docs", output=Briefing)
    [call] = [c for c in model_calls(ledger) if c["run_id"] == claim.run_id]
    assert (call["outcome"], call["answer"]["text"]) == ("answered", '{"summary": "x"}')
    assert call["rejected_at"] is not None
    again = recorded(server, ledger, reclaimed(ledger, claim))
    assert again.generate("docs", output=Briefing).parsed is not None
    assert (again.spent.made, again.spent.reused, len(server.requests)) == (1, 0, 2)


def test_a_refusal_is_a_paid_answer_then_the_run_fails_saying_why(
        server: ModelServer, ledger: Ledger) -> None:
    """The model's refusal: recorded as answered with its usage and reason, never replayed,
    and ModelRefused (permanent) names the reason."""
    claim = claimed(ledger)
    server.script.append(Reply(refusal="I can't help with that."))
    with pytest.raises(ModelRefused, match=r"refused to answer: I can.t help with that\.") as err:
        recorded(server, ledger, claim).generate("docs", output=Briefing)
    assert not err.value.retryable
    [call] = [c for c in model_calls(ledger) if c["run_id"] == claim.run_id]
    assert (call["outcome"], call["prompt_tokens"]) == ("answered", 120)
    assert call["answer"]["refusal"] == "I can't help with that."
    assert call["rejected_at"] is not None


@pytest.mark.parametrize("change", [
    {"output": Briefing2}, {"temperature": 0.7},
    {"messages": [Message("assistant", "Earlier answer.")]},
], ids=["schema", "temperature", "messages"])
def test_a_changed_schema_or_parameter_is_a_new_call_never_a_stale_replay(
        server: ModelServer, ledger: Ledger, change: dict[str, Any]) -> None:
    """The digest covers the request's shape: the next attempt with one thing changed pays a
    new call; unchanged, it replays."""
    first = claimed(ledger, lease=timedelta(seconds=1))
    asked: dict[str, Any] = {"output": Briefing, "temperature": 0.2}
    recorded(server, ledger, first).generate("docs", **asked)
    second = reclaimed(ledger, first, lease=timedelta(seconds=1))
    again = recorded(server, ledger, second)
    answer = again.generate("docs", **{**asked, **change})
    assert (again.spent.made, again.spent.reused, len(server.requests)) == (1, 0, 2)
    assert answer.parsed is not None
    third = reclaimed(ledger, second)  # the same changed call again: replayed this time
    replayed = recorded(server, ledger, third)
    assert replayed.generate("docs", **{**asked, **change}).parsed == answer.parsed
    assert (replayed.spent.made, replayed.spent.reused) == (0, 1)


def test_a_plain_prompt_keeps_the_digest_it_had(server: ModelServer, ledger: Ledger) -> None:
    """generate(prompt, system=...) and the same as messages are one call: its digest is the
    prompt digest that checkpoints written before requests had messages carry."""
    from flows.model import prompt_digest

    first = claimed(ledger, lease=timedelta(seconds=1))
    recorded(server, ledger, first).generate("docs", system="Summarize.")
    [call] = ledger.calls.of_run(first.run_id)
    assert call.prompt_digest == prompt_digest("probe-model", "docs", "Summarize.")
    again = recorded(server, ledger, reclaimed(ledger, first))
    messages = [Message("system", "Summarize."), Message("user", "docs")]
    assert again.generate(messages=messages).text == "answer 1"
    assert again.spent.reused == 1


@pytest.mark.parametrize(("asked", "fix"), [
    ({}, "needs a prompt or messages"),
    ({"messages": [Message("robot", "x")]}, "role among system, user, assistant"),  # type: ignore[arg-type]
    ({"prompt": "x", "output": dict}, "pydantic BaseModel subclass"),
    ({"prompt": "x", "output": Briefing(summary="s", launches=[])},
     "pydantic BaseModel subclass"),
    ({"prompt": "x", "max_tokens": 0}, "between 1 and the endpoint's max_tokens"),
    ({"prompt": "x", "max_tokens": 501}, r"max_tokens \(500\)"),
], ids=["nothing", "role", "dict", "instance", "zero", "above"])
def test_bad_input_is_refused_before_anything_is_recorded_or_sent(
        server: ModelServer, ledger: Ledger, asked: dict[str, Any], fix: str) -> None:
    """InvalidModelRequest names the fix; no model call row, no request, nothing counted."""
    claim = claimed(ledger)
    model = recorded(server, ledger, claim)
    with pytest.raises(InvalidModelRequest, match=fix):
        model.generate(**asked)
    assert ledger.calls.of_run(claim.run_id) == []
    assert server.requests == [] and model.spent.made == 0


def test_the_offline_model_answers_a_valid_instance_through_the_ledger(ledger: Ledger) -> None:
    """Offline, structured output validates too: the summary fills the text fields."""
    claim = claimed(ledger)
    model = RecordedModel(OfflineModel(max_sentences=1), ledger.calls, claim, PriceList(),
                          CallCount())
    answer = model.generate("Acme launched Rocket. Acme hired staff.", output=Briefing)
    assert isinstance(answer.parsed, Briefing)
    assert answer.parsed.summary == "Acme launched Rocket."
    assert [c.outcome for c in ledger.calls.of_run(claim.run_id)] == ["answered"]
