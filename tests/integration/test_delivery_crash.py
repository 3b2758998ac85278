"""A dispatcher SIGKILLed after the receiver accepted a message but before it was marked sent:
once the delivery lease expires the message is resent with the same Message-ID, so the
receiver's count of distinct Message-IDs equals the number of outbox rows."""

from __future__ import annotations

import email

import pytest

from flows.mail.letter import message_id_for
from flows.mail.sink import Sink
from store import Ledger
from tests.support.delivery import (
    deliver_killed_after_send,
    deliver_until_sent,
    queue,
    statuses,
)

pytestmark = pytest.mark.processes

LEASE_SECONDS = 4.0
TIMEOUT_SECONDS = 0.5


def test_a_message_accepted_before_the_crash_is_resent_with_the_same_message_id(
    db_url: str, ledger: Ledger
) -> None:
    """SIGKILL at after_send_before_mark, lease expiry, second pass: no message lost, the copy
    has the same Message-ID, unique Message-IDs == outbox rows."""
    queued = queue(ledger, 5)
    with Sink() as sink:
        deliver_killed_after_send(db_url, sink, LEASE_SECONDS, TIMEOUT_SECONDS)
        assert sink.stats["received"] == 1
        [first] = sink.messages
        assert statuses(ledger) == {"sending": 5}  # the whole batch was leased to the dead process

        deliver_until_sent(ledger, sink, 5, LEASE_SECONDS, TIMEOUT_SECONDS, 6 * LEASE_SECONDS)

        assert sink.stats["received"] == 6
        assert sink.stats["unique"] == len(queued) == 5
        copies = [m for m in sink.messages if m.message_id == first.message_id]
        assert len(copies) == 2
    resent_key = email.message_from_bytes(first.data)["X-Idempotency-Key"]
    assert first.message_id == message_id_for(resent_key)
    attempts = ledger.outbox.delivery_attempts(resent_key)
    # The killed attempt left no row (it never recorded an outcome); the resend is attempt 2.
    assert [(a.attempt, a.outcome) for a in attempts] == [(2, "sent")]
