"""Drill 4, the SMTP fault matrix at volume: N outbox messages (200 here, 2,000 with
RUNLEDGER_FULL=1) delivered by dispatcher passes to a sink that ends a random, seeded share of
tries with 421 or 451 (at RCPT or at DATA), 550 (at either), a connection dropped after DATA, or
a reply slower than the transport's timeout (and one just under it). Both ledgers. The policy's
short delays keep the backoff waits short; the passes run until nothing is due.

Asserted and printed: every message ends sent, dead or uncertain (none pending, retry or sending,
none due again); each try the sink saw is one delivery attempt in the ledger, in the state its
fault calls for; no message tried more than max_attempts times; each try after a failed one was
claimed no earlier than the backoff that attempt recorded (database clock), and no backoff above
the policy's ceiling; every sent message is at the sink; unique Message-IDs at the sink never
above the outbox rows."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, defaultdict
from itertools import pairwise

import pytest

from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy
from flows.delivery.report import Delivery
from flows.mail.letter import message_id_for
from flows.mail.sink import ACCEPTED, Fault, Sink
from flows.mail.smtp import SmtpTransport
from store import Ledger, QueuedMessage
from store.models import DeliveryAttempt
from tests.support.delivery import queue, smtp_settings

FULL = os.environ.get("RUNLEDGER_FULL") == "1"
MESSAGES = 2000 if FULL else 200
SEED = 24
TIMEOUT = 3.0  # the transport's wait for each SMTP reply: a loaded machine (make test runs the
# host drills beside it) outlasted 1 s connecting to the sink on loopback
SLOW, QUICK = 2 * TIMEOUT, 0.05  # a reply after the timeout, and one well inside it
POLICY = RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=0.4, max_window=3600)
# Each fault takes its share of the tries that reach its stage (independent draws, RCPT first).
FAULTS = [Fault("rcpt", "421", None, chance=0.05), Fault("rcpt", "451", None, chance=0.08),
          Fault("rcpt", "550", None, chance=0.03), Fault("data", "421", None, chance=0.04),
          Fault("data", "451", None, chance=0.06), Fault("data", "550", None, chance=0.02),
          Fault("data", "drop", None, chance=0.07),
          Fault("data", "slow", None, delay=SLOW, chance=0.02),
          Fault("data", "slow", None, delay=QUICK, chance=0.04)]
FINAL = {"sent", "dead", "uncertain"}
DEADLINE_SECONDS = 900 if FULL else 120


def expected(what: str, attempt: int) -> str:
    """The outcome the policy must record for a try that the sink ended with ``what``."""
    if what in (ACCEPTED, f"data:slow={QUICK:g}"):
        return "sent"
    if what.endswith(":550"):
        return "dead"
    if what in ("data:drop", f"data:slow={SLOW:g}"):
        return "uncertain"  # the sink has the data; held for an operator at the limit
    return "dead" if attempt >= POLICY.max_attempts else "retry"  # 421, 451


def settled(message: QueuedMessage) -> bool:
    """Sent, or dead or uncertain and never due again."""
    return message.status == "sent" or (message.status in FINAL and message.next_attempt_at is None)


def deliver_until_settled(ledger: Ledger, sink: Sink) -> tuple[list[Delivery], int]:
    """Dispatcher passes until no message is due now or later; the outcomes and the passes."""
    dispatcher = Dispatcher(ledger, SmtpTransport(smtp_settings(sink, timeout=TIMEOUT)), POLICY,
                            lease_seconds=60, rng=random.Random(SEED))
    deliveries: list[Delivery] = []
    passes = 0
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not all(settled(m) for m in ledger.outbox.messages(limit=MESSAGES)):
        assert time.monotonic() < deadline, statuses(ledger)
        report = asyncio.run(dispatcher.run_pass(batch_size=100, max_seconds=DEADLINE_SECONDS))
        passes += 1
        assert report.stopped is None and report.lost == 0, report.stopped
        assert sink.stats["unique"] <= MESSAGES
        deliveries += report.deliveries
        if not report.deliveries:
            time.sleep(POLICY.base_delay)  # every message left waits for its backoff
    return deliveries, passes


def statuses(ledger: Ledger) -> dict[str, int]:
    return {k: v for k, v in sorted(ledger.outbox.message_counts().items()) if v}


def test_a_random_mix_of_smtp_faults_ends_every_message_sent_dead_or_uncertain(
        ledger: Ledger) -> None:
    """Every message ends in a final state, each try lands where its fault says, within the
    attempt limit and the backoff, and the sink has every sent message and no unknown one."""
    queue(ledger, MESSAGES)
    started = time.monotonic()
    with Sink(faults=FAULTS, seed=SEED) as sink:  # faults of every message: never used up
        deliveries, passes = deliver_until_settled(ledger, sink)
    seconds = time.monotonic() - started
    messages = ledger.outbox.messages(limit=MESSAGES + 1)
    attempts = {m.message_id: ledger.outbox.delivery_attempts(m.message_id) for m in messages}
    tries: defaultdict[str, list[str]] = defaultdict(list)
    for recipient, what in sink.trace:
        tries[recipient.lower()].append(what)
    delays = {(d.message_id, d.attempt): d.delay for d in deliveries}
    matrix = Counter((what, a.outcome) for m in messages
                     for what, a in zip(tries[m.recipient], attempts[m.message_id], strict=False))
    print(f"\n{ledger.dialect}: {len(messages)} messages, {sum(map(len, attempts.values()))} "
          f"tries in {passes} passes ({seconds:.1f} s); final states {statuses(ledger)}")
    print(f"tries by what the sink did: {dict(Counter(w for _, w in sink.trace).most_common())}")
    print(f"attempts per message: {dict(sorted(Counter(m.attempts for m in messages).items()))}")
    print(f"sink: {sink.stats['received']} received, {sink.stats['unique']} unique Message-IDs "
          f"(of {len(messages)} outbox rows)")
    print("outcome of each kind of try: " + ", ".join(
        f"{what} -> {outcome} x{n}" for (what, outcome), n in sorted(matrix.items())))
    assert len(messages) == MESSAGES
    assert all(settled(m) for m in messages)  # none pending, retry, sending or due again
    for m in messages:
        assert_tries(m, attempts[m.message_id], tries[m.recipient], delays, ledger.dialect)
    at_sink = {r.message_id for r in sink.messages}
    sent = {message_id_for(m.message_id) for m in messages if m.status == "sent"}
    assert sent <= at_sink <= {message_id_for(m.message_id) for m in messages}  # 0 lost
    # A message the sink has but the ledger does not call sent had a try that ended uncertain.
    unsent = {m.message_id for m in messages if message_id_for(m.message_id) in at_sink - sent}
    assert all(any(a.outcome == "uncertain" for a in attempts[i]) for i in unsent)
    assert {w for _, w in sink.trace} == {ACCEPTED, *(f.label for f in FAULTS)}


def matched(attempts: list[DeliveryAttempt], tried: list[str]) -> bool:
    """Each try at the sink has its attempt with the outcome the policy must record; an attempt
    without a try never reached RCPT (its connection or greeting outlasted the short timeout on a
    loaded machine): no reply, and a transient outcome (retry, or dead at the limit)."""
    left = list(tried)
    for a in attempts:
        if left and a.outcome == expected(left[0], a.attempt):
            left.pop(0)
        elif a.reply_code is not None or a.outcome != expected("rcpt:421", a.attempt):
            return False
    return not left


def assert_tries(message: QueuedMessage, attempts: list[DeliveryAttempt], tried: list[str],
                 delays: dict[tuple[str, int], float | None], dialect: str) -> None:
    """One message's tries at the sink against its delivery attempts in the ledger."""
    assert message.attempts == len(attempts) <= POLICY.max_attempts, (message.message_id, tried)
    assert [a.attempt for a in attempts] == list(range(1, len(attempts) + 1))
    assert matched(attempts, tried), (message.message_id, tried, [a.outcome for a in attempts])
    assert attempts[-1].outcome == message.status
    # SQLite writes the attempt row (finished_at) in a statement after the one that set the due
    # time, and its clock steps in milliseconds; PostgreSQL writes both in one statement.
    slack = 0.0 if dialect == "postgresql" else 0.02
    for before, after in pairwise(attempts):
        delay = delays[(message.message_id, before.attempt)]
        assert delay is not None and delay <= POLICY.ceiling(before.attempt)
        assert before.finished_at is not None and after.started_at is not None
        waited = (after.started_at - before.finished_at).total_seconds()
        assert waited >= delay - slack, (message.message_id, before.attempt, waited, delay)


pytestmark = [pytest.mark.drill, pytest.mark.timeout(DEADLINE_SECONDS + 120)]
