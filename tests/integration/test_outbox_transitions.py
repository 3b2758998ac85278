"""Outbox transitions added for delivery: marking a group sent in one transaction (again, after
its commit, as a success), and giving back a claim into the state it was claimed from."""

from __future__ import annotations

import time

from store import Ledger, Reply
from tests.support.delivery import queue


def test_marking_a_group_sent_records_each_attempt(ledger: Ledger) -> None:
    """mark_sent: every held message becomes sent with its own attempt row and reply."""
    queue(ledger, 3)
    claims = ledger.outbox.claim_messages("dispatcher-a", 10, 60)
    lost = ledger.outbox.mark_sent([(c, Reply(250, f"queued {i}", f"p{i}")) for i, c in enumerate(claims)])
    assert lost == []
    assert ledger.outbox.message_counts() == {"sent": 3}
    for i, claim in enumerate(claims):
        [attempt] = ledger.outbox.delivery_attempts(claim.message_id)
        assert (attempt.outcome, attempt.reply_code, attempt.reply_text, attempt.provider_message_id,
                attempt.owner) == ("sent", 250, f"queued {i}", f"p{i}", "dispatcher-a")
        stored = ledger.outbox.message(claim.message_id)
        assert stored is not None and stored.provider_message_id == f"p{i}" and stored.sent_at


def test_a_stale_claim_in_a_group_is_reported_and_left_alone(ledger: Ledger) -> None:
    """A claim whose lease moved to another dispatcher is returned as lost; only the new holder's
    outcome can be recorded, and the others in the group are still marked."""
    queue(ledger, 2)
    first, second = ledger.outbox.claim_messages("dispatcher-a", 10, 0.001)
    time.sleep(0.05)
    [taken] = ledger.outbox.claim_messages("dispatcher-b", 1, 60)  # the expired lease is taken over
    stale, kept = (first, second) if taken.message_id == first.message_id else (second, first)
    lost = ledger.outbox.mark_sent([(stale, Reply(250)), (kept, Reply(250))])
    assert [c.message_id for c in lost] == [stale.message_id]
    assert ledger.outbox.message(kept.message_id).status == "sent"  # type: ignore[union-attr]
    assert ledger.outbox.message(stale.message_id).lease_owner == "dispatcher-b"  # type: ignore[union-attr]
    assert ledger.outbox.delivery_attempts(stale.message_id) == []


def test_a_sent_mark_retried_after_it_committed_reports_success_and_records_nothing_more(
        ledger: Ledger) -> None:
    """The same claims marked sent a second time (the reply to the first commit was lost): no
    claim is reported lost and each message keeps its one sent attempt; a stale claim of a
    message another dispatcher then sent is still reported lost."""
    queue(ledger, 3)
    first, second, third = ledger.outbox.claim_messages("dispatcher-a", 10, 60)
    assert ledger.outbox.mark_sent([(first, Reply(250)), (second, Reply(250))]) == []
    assert ledger.outbox.mark_sent([(first, Reply(250)), (second, Reply(250)), (third, Reply(250))]) == []
    assert ledger.outbox.message_counts() == {"sent": 3}
    for claim in (first, second, third):
        assert [(a.attempt, a.outcome, a.owner) for a in ledger.outbox.delivery_attempts(
            claim.message_id)] == [(1, "sent", "dispatcher-a")]
    queue(ledger, 1)
    [stale] = ledger.outbox.claim_messages("dispatcher-a", 1, 0.001)
    time.sleep(0.05)
    [taken] = ledger.outbox.claim_messages("dispatcher-b", 1, 60)
    assert ledger.outbox.mark_sent([(taken, Reply(250))]) == []
    assert ledger.outbox.mark_sent([(stale, Reply(250))]) == [stale]


def test_a_released_uncertain_message_stays_uncertain(ledger: Ledger) -> None:
    """Claiming remembers the previous status; giving the claim back restores it (an uncertain
    message stays visible as uncertain) without counting a try."""
    [message] = queue(ledger, 1)
    [claim] = ledger.outbox.claim_messages("dispatcher-a", 1, 60)
    ledger.outbox.mark_uncertain(claim, "lost after DATA", retry_in=0)
    [again] = ledger.outbox.claim_messages("dispatcher-a", 1, 60)
    assert again.previous_status == "uncertain" and again.attempt == 2
    ledger.outbox.release_message(again)
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and (stored.status, stored.attempts) == ("uncertain", 1)


def test_a_claim_takes_the_oldest_due_messages_and_skips_the_not_yet_due_and_the_held(
        ledger: Ledger) -> None:
    """Claim order is next_attempt_at: a retry scheduled for later waits, a message held under a
    live delivery lease is skipped, one whose lease expired is taken again; sent ones never."""
    messages = queue(ledger, 5)
    [sent, later, held, released] = ledger.outbox.claim_messages("dispatcher-a", 4, 60)
    assert {c.message_id for c in (sent, later, held, released)} == {
        m.message_id for m in messages[:4]}
    assert ledger.outbox.mark_sent([(sent, Reply())]) == []
    ledger.outbox.schedule_retry(later, 3600, "421 try later")
    ledger.outbox.release_message(released)  # due again, from now: after the fifth message
    [lapsing] = ledger.outbox.claim_messages("dispatcher-a", 1, 0.001)
    assert lapsing.message_id == messages[4].message_id
    time.sleep(0.05)
    taken = {c.message_id: c for c in ledger.outbox.claim_messages("dispatcher-b", 10, 60)}
    assert set(taken) == {lapsing.message_id, released.message_id}
    retaken = taken[lapsing.message_id]
    assert retaken.previous_status == "sending" and retaken.fence == lapsing.fence + 1
    assert ledger.outbox.claim_messages("dispatcher-c", 10, 60) == []
