"""Fuzzed answers of a real HTTP email provider on loopback, delivered from real ledgers
(SQLite and PostgreSQL): whatever it answers, the pass ends, the message lands in a state
that matches the answer, and the ledger stored what it was told."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.loopback import Answer, LoopbackServer, Request
from flows.mail.errors import MailConfigurationError
from store import Ledger
from tests.support.delivery import deliver, queue, transport

BODIES = st.sampled_from([
    b'{"id": "e-1"}', b'{"id": 12345}', b'{"id": {"nested": true}}',
    b'{"id": "' + b"x" * 400 + b'"}', b'{"id": "a\\u0000b"}', b'{"message": "a\\u0000b"}',
    b'{"name": "concurrent_idempotent_requests"}', b"[1, 2]", b"\xff\xfe not utf-8", b"",
    b"\x00", b'{"message": "\\ud800"}',
]) | st.binary(max_size=32)
EXPECTED = {"sent", "retry", "dead"}


class Scripted(LoopbackServer):
    """Answers every request with the current ``answer_with``."""

    answer_with = Answer(200, b"{}")

    def answer(self, request: Request) -> Answer:
        return self.answer_with


@pytest.fixture
def provider() -> Iterator[Scripted]:
    with Scripted() as server:
        yield server


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from([200, 201, 202, 400, 404, 409, 410, 422, 429, 500, 502, 503]),
       body=BODIES, retry_after=st.sampled_from([None, "1e999", "nan", "-3", "0", "garbage"]))
@example(status=200, body=b'{"id": {"nested": true}}', retry_after=None)
@example(status=200, body=b'{"id": "' + b"x" * 400 + b'"}', retry_after=None)
@example(status=200, body=b'{"id": "a\\u0000b"}', retry_after=None)
@example(status=500, body=b'{"message": "a\\u0000b"}', retry_after=None)
@example(status=503, body=b"\x00", retry_after="1e999")
def test_any_provider_answer_is_recorded_in_the_ledger(
        ledger: Ledger, provider: Scripted, status: int, body: bytes,
        retry_after: str | None) -> None:
    """2xx: sent (with the id when it is usable); 429/5xx/in-flight 409: retry (or dead at
    the limit); other 4xx: dead; never an exception out of the pass."""
    headers = {"Content-Type": "application/json"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    provider.answer_with = Answer(status, body, headers)
    [message] = queue(ledger, 1)
    deliver(ledger, transport=transport(provider))
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and stored.status in EXPECTED
    assert (stored.status == "sent") == (200 <= status < 300)
    [attempt] = ledger.outbox.delivery_attempts(message.message_id)
    assert attempt.reply_code == status


def test_a_refused_api_key_sends_nothing_and_gives_the_message_back(
        ledger: Ledger, provider: Scripted) -> None:
    """401 from the provider: a configuration error naming the setting; the message is due
    again with no attempt counted."""
    provider.answer_with = Answer(401, b'{"message": "bad key\\u0000"}',
                                  {"Content-Type": "application/json"})
    [message] = queue(ledger, 1)
    with pytest.raises(MailConfigurationError, match="RUNLEDGER_PROVIDER_API_KEY"):
        deliver(ledger, transport=transport(provider))
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and stored.status in ("pending", "retry")
