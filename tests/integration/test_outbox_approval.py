"""Held outbox messages (issue 49): a held message is never sent; a person's approval makes it
due with its key and the ordinary pass delivers it once, also after a dispatcher is killed
between the send and its mark; a rejection is never sent; every decision is recorded; a bad
decision changes nothing."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from flows.mail.sink import Sink
from store import Ledger
from store.errors import InvalidInput, InvalidTransition, MessageNotFound
from tests.support.delivery import (
    RUNLEDGER,
    cli_env,
    deliver,
    deliver_killed_after_send,
    deliver_until_sent,
    queue,
    statuses,
)
from tests.support.killed import run_killed

DAY = timedelta(days=1)
LEASE_SECONDS = 4.0
TIMEOUT_SECONDS = 0.5


def test_a_held_message_is_never_sent_and_its_hold_is_overdue_after_its_deadline(
        ledger: Ledger) -> None:
    """A pass over held messages sends nothing; each holds its deadline by the database clock."""
    before = ledger.now()
    held = queue(ledger, 2, hold=DAY)
    with Sink() as sink:
        report = deliver(ledger, sink)
        assert sink.stats["received"] == 0
    assert report.counts.get("sent", 0) == 0
    assert statuses(ledger) == {"held": 2}
    for message in held:
        assert message.hold_until is not None
        assert before + DAY <= message.hold_until <= ledger.now() + DAY


def test_approved_messages_are_delivered_once_and_the_decision_is_recorded(
        ledger: Ledger) -> None:
    """approve: held -> pending, due now; the pass sends each once; who, when, why are kept."""
    held = queue(ledger, 3, hold=DAY)
    decided = ledger.outbox.decide([m.message_id for m in held[:2]], "approved", "alice",
                                   "read it, fine")
    assert [m.status for m in decided] == ["pending", "pending"]
    with Sink() as sink:
        deliver(ledger, sink)
        deliver(ledger, sink)
        assert (sink.stats["received"], sink.stats["unique"]) == (2, 2)
    assert statuses(ledger) == {"sent": 2, "held": 1}
    for message in held[:2]:
        stored = ledger.outbox.message(message.message_id)
        assert stored is not None
        assert (stored.status, stored.decision, stored.decided_by, stored.decision_reason) == (
            "sent", "approved", "alice", "read it, fine")
        assert stored.decided_at is not None and stored.decided_at <= ledger.now()


def test_a_rejected_message_is_never_sent_and_stays_visible_with_its_reason(
        ledger: Ledger) -> None:
    """reject: held -> rejected, never claimed; the reason is required and recorded."""
    [message] = queue(ledger, 1, hold=DAY)
    with pytest.raises(InvalidInput, match="a rejection needs a reason"):
        ledger.outbox.decide([message.message_id], "rejected", "bob", None)
    ledger.outbox.decide([message.message_id], "rejected", "bob", "wrong numbers")
    with Sink() as sink:
        deliver(ledger, sink)
        assert sink.stats["received"] == 0
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None
    assert (stored.status, stored.decision, stored.decided_by, stored.decision_reason) == (
        "rejected", "rejected", "bob", "wrong numbers")
    assert ledger.outbox.delivery_attempts(message.message_id) == []


def test_deciding_an_unknown_or_already_sent_message_changes_nothing(ledger: Ledger) -> None:
    """All or none: one unknown id, or one message that is not held, refuses the whole decision
    with a line naming it; the held messages given with it stay held, undecided."""
    held = queue(ledger, 2, hold=DAY)
    [sent] = queue(ledger, 1)
    with Sink() as sink:
        deliver(ledger, sink)
    ids = [m.message_id for m in held]
    with pytest.raises(MessageNotFound, match=r"no outbox message with id 'f{64}'; nothing"):
        ledger.outbox.decide([*ids, "f" * 64], "approved", "alice")
    with pytest.raises(InvalidTransition,
                       match=rf"message {sent.message_id} is sent, not held: only a held"):
        ledger.outbox.decide([*ids, sent.message_id], "approved", "alice")
    assert statuses(ledger) == {"sent": 1, "held": 2}
    ledger.outbox.decide(ids, "approved", "alice")
    with pytest.raises(InvalidTransition, match=rf"message {ids[0]} is pending, not held"):
        ledger.outbox.decide(ids[:1], "rejected", "bob", "too late")
    assert statuses(ledger) == {"sent": 1, "pending": 2}
    with pytest.raises(InvalidInput, match="decision must be one of approved, rejected"):
        ledger.outbox.decide(ids, "maybe", "alice")
    with pytest.raises(InvalidInput, match="who decides must be a name"):
        ledger.outbox.decide(ids, "approved", " ")


def test_a_message_not_held_is_refused_before_anything_changes(ledger: Ledger) -> None:
    """A held message given with a sent one stays held, with no decision recorded."""
    [held] = queue(ledger, 1, hold=DAY)
    [sent] = queue(ledger, 1)
    with Sink() as sink:
        deliver(ledger, sink)
    with pytest.raises(InvalidTransition):
        ledger.outbox.decide([held.message_id, sent.message_id], "rejected", "bob", "no")
    stored = ledger.outbox.message(held.message_id)
    assert stored is not None and (stored.status, stored.decision, stored.decided_by) == (
        "held", None, None)


@pytest.mark.processes
def test_an_approved_message_whose_dispatcher_is_killed_after_the_send_arrives_once(
        db_url: str, ledger: Ledger) -> None:
    """Approval, then a dispatcher SIGKILLed after the receiver accepted the message and before
    its mark: after the lease expires the next pass resends it with the same Message-ID, and
    the receiver counts one message per approved row."""
    held = queue(ledger, 3, hold=DAY)
    ledger.outbox.decide([m.message_id for m in held], "approved", "alice")
    with Sink() as sink:
        deliver_killed_after_send(db_url, sink, LEASE_SECONDS, TIMEOUT_SECONDS)
        deliver_until_sent(ledger, sink, 3, LEASE_SECONDS, TIMEOUT_SECONDS, 10 * LEASE_SECONDS)
        assert sink.stats["unique"] == 3


@pytest.mark.processes
def test_an_approval_killed_after_its_commit_is_kept_and_delivered_once(
        db_url: str, ledger: Ledger) -> None:
    """`runledger outbox approve` SIGKILLed right after its commit: the decision stands (the
    message is pending, approved by its operator) and one pass delivers it once."""
    [held] = queue(ledger, 1, hold=DAY)
    with Sink() as sink:
        env = cli_env(db_url, sink, RUNLEDGER_FAULTS="after_decide_messages_commit")
        killed = run_killed([*RUNLEDGER, "outbox", "approve", held.message_id, "--by", "carol"],
                            env, timeout=120)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        stored = ledger.outbox.message(held.message_id)
        assert stored is not None and (stored.status, stored.decided_by) == ("pending", "carol")
        deliver(ledger, sink)
        deliver(ledger, sink)
        assert (sink.stats["received"], sink.stats["unique"]) == (1, 1)


def test_the_decision_time_is_an_aware_utc_timestamp(ledger: Ledger) -> None:
    """The decision time comes back timezone-aware in UTC on both ledgers."""
    [held] = queue(ledger, 1, hold=DAY)
    [decided] = ledger.outbox.decide([held.message_id], "approved", "alice")
    assert decided.decided_at is not None and decided.decided_at.tzinfo is not None
    assert decided.decided_at > datetime(2026, 1, 1, tzinfo=UTC)


def test_pruning_keeps_every_decision_and_never_a_run_still_held(ledger: Ledger) -> None:
    """prune: a Run whose message is held stays whole; the Runs whose messages were approved
    (and sent) or rejected become tombstones, and their decided outbox rows stay as the record
    of who decided, when and why."""
    approved, rejected, waiting = (queue(ledger, 1, hold=DAY)[0] for _ in range(3))
    ledger.outbox.decide([approved.message_id], "approved", "alice", "fine")
    ledger.outbox.decide([rejected.message_id], "rejected", "bob", "wrong")
    with Sink() as sink:
        deliver(ledger, sink)
    cutoff, after = ledger.now() + timedelta(minutes=1), ""
    while True:
        batch = ledger.retention.prune_batch(cutoff, ["digest"], after=after)
        if batch.cursor is None:
            break
        after = batch.cursor
    assert ledger.get(approved.run_id).pruned_at is not None
    assert ledger.get(rejected.run_id).pruned_at is not None
    assert ledger.get(waiting.run_id).pruned_at is None
    kept = {m.message_id: m for m in ledger.outbox.messages(limit=10)}
    assert (kept[approved.message_id].status, kept[approved.message_id].decided_by) == (
        "sent", "alice")
    assert (kept[rejected.message_id].decision_reason, kept[waiting.message_id].status) == (
        "wrong", "held")
