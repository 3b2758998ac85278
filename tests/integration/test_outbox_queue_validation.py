"""Bad input is refused when a job queues its messages, and nothing is written."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from store import Ledger, OutboxMessage, RunIdentity
from store.errors import InvalidMessage


def test_an_injection_attempt_refuses_the_completion_and_writes_nothing(ledger: Ledger) -> None:
    """An encoded newline in one subject stops the job before completion: the Run stays
    running and the outbox stays empty."""
    identity = RunIdentity("digest", f"s-{uuid.uuid4().hex[:6]}", datetime(2026, 1, 5, tzinfo=UTC), "v1")
    ledger.register(identity)
    claim = ledger.claim(identity.run_id, "worker", 60)
    assert claim is not None
    with pytest.raises(InvalidMessage, match="encoded word"):
        messages = [
            OutboxMessage(recipient="ana@example.com", subject="Digest", body="ok"),
            OutboxMessage(recipient="bob@example.com", subject="=?utf-8?q?x=0ABcc:_e@example.com?=",
                          body="ok"),
        ]
        ledger.complete(claim, {"summary": "ok"}, messages)
    assert ledger.get(identity.run_id).status == "running"
    assert ledger.outbox.message_counts() == {}
