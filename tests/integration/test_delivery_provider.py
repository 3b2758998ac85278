"""The HTTP provider transport against a real local HTTP server that behaves like Resend's
idempotency: same key and payload → the original answer; same key, other payload → 409."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bench.loopback import Answer, LoopbackServer, Request, json_answer
from flows.delivery.policy import RetryPolicy
from flows.errors import DeliveryConfigurationError
from flows.mail.errors import MailConfigurationError
from flows.mail.letter import message_id_for
from store import Ledger
from tests.support.delivery import API_KEY, deliver, queue, statuses, transport


@dataclass
class Scripted:
    """A canned answer for the next request (instead of the idempotent default)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    sleep: float = 0.0
    remember: bool = False  # also store the key, as a provider that accepted it would


class FakeProvider(LoopbackServer):
    """Records every request; answers scripted replies first, then Resend-style idempotency."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []
        self.script: list[Scripted] = []
        self.emails: dict[str, tuple[str, str]] = {}  # key -> (payload digest, email id)
        self.lock = threading.Lock()

    def answer(self, request: Request) -> Answer:
        key = request.headers.get("Idempotency-Key", "")
        with self.lock:
            self.requests.append({"path": request.path, "key": key,
                                  "auth": request.headers.get("Authorization"),
                                  "payload": json.loads(request.body), "at": time.monotonic()})
            digest = hashlib.sha256(request.body).hexdigest()
            if self.script:
                scripted = self.script.pop(0)
                if scripted.remember:
                    self.emails[key] = (digest, f"email-{uuid.uuid4().hex[:8]}")
                return json_answer(scripted.status, scripted.body, scripted.headers, scripted.sleep)
            if key in self.emails:
                known_digest, email_id = self.emails[key]
                if known_digest != digest:
                    return json_answer(409, {"name": "invalid_idempotent_request",
                                       "message": "same key, different payload"})
                return json_answer(200, {"id": email_id})
            email_id = f"email-{uuid.uuid4().hex[:8]}"
            self.emails[key] = (digest, email_id)
            return json_answer(200, {"id": email_id})


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def send(ledger: Ledger, provider: FakeProvider, **options: Any) -> Any:
    return deliver(ledger, transport=transport(provider, **options.pop("settings", {})), **options)


def send_when_due(ledger: Ledger, provider: FakeProvider, within: float = 10.0) -> Any:
    """The first pass that finds the retried message due (its backoff is at most FAST's 0.02 s,
    but a loaded machine may run the next pass before the ledger's clock passed it)."""
    deadline = time.monotonic() + within
    while True:
        report = send(ledger, provider)
        if sum(report.counts.values()) or time.monotonic() > deadline:
            assert sum(report.counts.values()), f"the retried message was not due within {within} s"
            return report
        time.sleep(0.02)


def test_provider_gets_the_stable_key_and_returns_its_message_id(ledger: Ledger,
                                                                   provider: FakeProvider) -> None:
    """POST /emails with Idempotency-Key = the message key, the Message-ID header, the API key;
    the provider's email id is stored on the message and its attempt."""
    [message] = queue(ledger, 1)
    assert send(ledger, provider).counts["sent"] == 1
    [request] = provider.requests
    assert request["path"] == "/emails" and request["key"] == message.message_id
    assert request["auth"] == f"Bearer {API_KEY}"
    assert request["payload"]["headers"]["Message-ID"] == message_id_for(message.message_id)
    assert request["payload"]["to"] == [message.recipient]
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and stored.provider_message_id == provider.emails[message.message_id][1]
    [attempt] = ledger.outbox.delivery_attempts(message.message_id)
    assert attempt.provider_message_id == stored.provider_message_id


def test_a_5xx_is_retried_with_the_same_key_and_payload(ledger: Ledger, provider: FakeProvider) -> None:
    """500 then success: both requests carry the same key and byte-identical payloads."""
    [message] = queue(ledger, 1)
    provider.script.append(Scripted(500, {"name": "internal_server_error", "message": "oops"}))
    assert send(ledger, provider).counts["retry"] == 1
    assert send_when_due(ledger, provider).counts["sent"] == 1
    first, second = provider.requests
    assert first["key"] == second["key"] == message.message_id
    assert first["payload"] == second["payload"]
    assert [a.outcome for a in ledger.outbox.delivery_attempts(message.message_id)] == ["retry", "sent"]


def test_a_timeout_after_the_request_is_uncertain_and_the_retry_is_deduplicated(
    ledger: Ledger, provider: FakeProvider
) -> None:
    """The provider accepts but answers too late: uncertain; the retry with the same key gets
    the original email id back, so the provider created exactly one email."""
    [message] = queue(ledger, 1)
    provider.script.append(Scripted(200, {"id": "email-original"}, sleep=1.0, remember=True))
    report = send(ledger, provider, settings={"timeout": 0.3})
    assert report.counts["uncertain"] == 1
    assert send_when_due(ledger, provider).counts["sent"] == 1
    assert len(provider.emails) == 1 and len(provider.requests) == 2
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and stored.provider_message_id == provider.emails[message.message_id][1]


def test_409_payload_mismatch_is_permanent(ledger: Ledger, provider: FakeProvider) -> None:
    """invalid_idempotent_request (same key, other payload) → dead, reply recorded, no retry."""
    [message] = queue(ledger, 1)
    provider.script.append(Scripted(409, {"name": "invalid_idempotent_request", "message": "x"}))
    assert send(ledger, provider).counts["dead"] == 1
    [attempt] = ledger.outbox.delivery_attempts(message.message_id)
    assert attempt.reply_code == 409 and "invalid_idempotent_request" in (attempt.reply_text or "")


def test_409_concurrent_request_is_transient(ledger: Ledger, provider: FakeProvider) -> None:
    """concurrent_idempotent_requests (the first request still in flight) → retry."""
    queue(ledger, 1)
    provider.script.append(Scripted(409, {"name": "concurrent_idempotent_requests", "message": "x"}))
    assert send(ledger, provider).counts["retry"] == 1
    assert send_when_due(ledger, provider).counts["sent"] == 1


def test_429_retry_after_delays_the_message(ledger: Ledger, provider: FakeProvider) -> None:
    """429 with Retry-After: 1 → the message is not due again for at least a second."""
    queue(ledger, 1)
    provider.script.append(Scripted(429, {"name": "rate_limit_exceeded", "message": "slow down"},
                                    headers={"Retry-After": "1"}))
    assert send(ledger, provider, max_seconds=0.5).counts["retry"] == 1
    assert sum(send(ledger, provider).counts.values()) == 0  # not due yet
    assert send_when_due(ledger, provider, within=30).counts["sent"] == 1
    first, second = provider.requests
    assert second["at"] - first["at"] >= 1.0


def test_429_retry_after_pauses_the_pass(ledger: Ledger, provider: FakeProvider) -> None:
    """After a 429 with Retry-After: 1 the dispatcher sends nothing else for that second."""
    queue(ledger, 2)
    provider.script.append(Scripted(429, {"name": "rate_limit_exceeded", "message": "slow down"},
                                    headers={"Retry-After": "1"}))
    report = send(ledger, provider)
    assert report.counts["retry"] == 1 and report.counts["sent"] == 1
    first, second = provider.requests
    assert second["at"] - first["at"] >= 1.0


def test_other_4xx_is_permanent(ledger: Ledger, provider: FakeProvider) -> None:
    """422 validation_error → dead after one attempt."""
    queue(ledger, 1)
    provider.script.append(Scripted(422, {"name": "validation_error", "message": "bad to"}))
    assert send(ledger, provider).counts["dead"] == 1


def test_a_refused_api_key_stops_the_run(ledger: Ledger, provider: FakeProvider) -> None:
    """401 → one MailConfigurationError (without the key); messages released, no attempt."""
    queue(ledger, 3)
    provider.script.append(Scripted(401, {"name": "missing_api_key", "message": "bad key"}))
    with pytest.raises(MailConfigurationError, match="refused the API key") as failure:
        send(ledger, provider)
    assert API_KEY not in str(failure.value)
    assert statuses(ledger) == {"pending": 3}


def test_a_retry_window_longer_than_the_key_retention_is_refused(ledger: Ledger,
                                                                 provider: FakeProvider) -> None:
    """A 25 h retry window over a 24 h idempotency-key retention is refused before any claim."""
    queue(ledger, 1)
    too_long = RetryPolicy(max_window=25 * 3600)
    with pytest.raises(DeliveryConfigurationError, match="retention"):
        send(ledger, provider, policy=too_long)
    assert statuses(ledger) == {"pending": 1} and provider.requests == []
