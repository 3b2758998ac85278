"""Drill 4 for the webhook and object-storage channels: N effects per channel (150 here, 2,000
with RUNLEDGER_FULL=1) delivered by dispatcher passes through random, seeded faults, on both
ledgers.

Webhooks go to a real receiver on loopback that answers a share of POSTs with 409 (in flight),
429 (Retry-After), 500 before processing, 503 after processing, 422, 400, a connection dropped
after processing, or a reply slower than the timeout; once for each kind of receiver: one that
honours the Idempotency-Key, one that ignores it but offers a status lookup, and one with
neither (the documented limit: it may get a copy). Objects go to moto's S3 through a proxy that
answers a share of PUTs with 503 or 500 before forwarding, or forwards them and then drops the
connection or answers too late, and a share of HEADs with 503; 2 % of the keys already hold
someone else's object.

Asserted and printed: every effect ends sent, dead or uncertain (none pending, retry or sending,
none due again); every sent effect is at the receiver or in the bucket (0 lost); a receiver that
honours the key or offers a lookup processed no effect twice (0 duplicates); no object was
overwritten, and each sent object holds its body (its sha256 checked on a sample of 100). And for
webhooks, with dispatcher
processes SIGKILLed between the receiver's acceptance and the sent mark (5 kills here, 20 at full
size): every effect sent, each processed once by a receiver that honours the key or offers a
lookup."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing as mp
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy
from flows.objects.bucket import Bucket, bucket_from_block
from flows.objects.transport import DIGEST_META, ObjectStoreTransport
from store import AFTER_SEND_BEFORE_MARK, Ledger, OutboxMessage, QueuedMessage
from tests.support.armed import PRELOAD, run_armed
from tests.support.channels import (
    complete_with,
    webhook_transport,
    webhooks,
)
from tests.support.faulty_proxy import DROP, ERROR_500, ERROR_503, PASS, SLOW, FaultyProxy
from tests.support.object_store import BUCKET, BUCKET_BLOCK, MotoS3
from tests.support.webhook_receiver import Fault, WebhookReceiver

FULL = os.environ.get("RUNLEDGER_FULL") == "1"
EFFECTS = 2000 if FULL else 150
SEED = 37
TIMEOUT = 0.5  # the transports' wait for an answer
SLOW_SECONDS = 2 * TIMEOUT
POLICY = RetryPolicy(max_attempts=3, base_delay=0.05, max_delay=0.2, max_window=3600)
FINAL = {"sent", "dead", "uncertain"}
# moto answers about 7 requests a second here: the full object run needs its half hour.
DEADLINE_SECONDS = 1800 if FULL else 180
# (label, fault, share of POSTs)
WEBHOOK_FAULTS = [
    ("409 in flight", Fault(status=409), 0.04),
    ("429 Retry-After", Fault(status=429, retry_after="0.02"), 0.05),
    ("500 before processing", Fault(status=500), 0.05),
    ("503 after processing", Fault(status=503, processed=True), 0.04),
    ("422", Fault(status=422), 0.01),
    ("400", Fault(status=400), 0.01),
    ("drop after processing", Fault(drop=True), 0.05),
    ("slow after processing", Fault(delay=SLOW_SECONDS), 0.02),
]
PUT_FAULTS = [(ERROR_503, 0.05), (ERROR_500, 0.04), (DROP, 0.06), (SLOW, 0.02)]
HEAD_FAULTS = [(ERROR_503, 0.03)]
CONFLICTS = 0.02


def draw(seed: str, faults: list[tuple[Any, float]]) -> Any | None:
    """One seeded pick among ``faults`` by their shares, or None (no fault)."""
    point, total = random.Random(seed).random(), 0.0
    for what, share in faults:
        total += share
        if point < total:
            return what
    return None


def settled(message: QueuedMessage) -> bool:
    return message.status == "sent" or (message.status in FINAL and message.next_attempt_at is None)


def statuses(ledger: Ledger) -> dict[str, int]:
    return {k: v for k, v in sorted(ledger.outbox.message_counts().items()) if v}


def deliver_until_settled(ledger: Ledger, dispatcher: Dispatcher, count: int) -> int:
    """Dispatcher passes until no message is due now or later; the number of passes."""
    passes = 0
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not all(settled(m) for m in ledger.outbox.messages(limit=count + 1)):
        assert time.monotonic() < deadline, statuses(ledger)
        report = asyncio.run(dispatcher.run_pass(batch_size=100, max_seconds=DEADLINE_SECONDS))
        passes += 1
        assert report.stopped is None and report.lost == 0, report.stopped
        if not report.deliveries:
            time.sleep(POLICY.base_delay)
    return passes


RECEIVERS = {  # name -> (honours the key, offers a lookup)
    "honours the key": (True, False),
    "offers a lookup": (False, True),
    "neither": (False, False),
}


@pytest.mark.parametrize("kind", list(RECEIVERS))
def test_webhooks_through_random_faults_end_final_and_unduplicated(
        ledger: Ledger, kind: str) -> None:
    """Every webhook ends sent, dead or uncertain; every sent one reached the receiver; a
    receiver that honours the key or offers a lookup processed none twice."""
    honour, lookup = RECEIVERS[kind]
    rows = complete_with(ledger, webhooks(EFFECTS))
    tried: Counter[str] = Counter()

    def chooser(key: str, n: int) -> Fault | None:
        picked = draw(f"{SEED}:{key}:{n}", [(label, share) for label, _, share in WEBHOOK_FAULTS])
        tried[picked or "accepted"] += 1
        return next((f for label, f, _ in WEBHOOK_FAULTS if label == picked), None)

    started = time.monotonic()
    with WebhookReceiver(honour_key=honour, lookup=lookup) as receiver:
        receiver.chooser = chooser
        transport = webhook_transport(receiver.url, lookup=lookup, timeout=TIMEOUT)
        dispatcher = Dispatcher(ledger, transport, POLICY, lease_seconds=60,
                                rng=random.Random(SEED))
        passes = deliver_until_settled(ledger, dispatcher, EFFECTS)
    seconds = time.monotonic() - started
    messages = ledger.outbox.messages(limit=EFFECTS + 1)
    keys = {m.message_id for m in rows}
    sent = {m.message_id for m in messages if m.status == "sent"}
    print(f"\nwebhook, receiver {kind}, {ledger.dialect}: {len(messages)} effects, "
          f"{sum(m.attempts for m in messages)} attempts in {passes} passes ({seconds:.1f} s); "
          f"final {statuses(ledger)}; POSTs {sum(receiver.posts.values())}, lookups "
          f"{sum(receiver.lookups.values())}, processed {len(receiver.processed)} effects, "
          f"duplicates {receiver.duplicates}")
    print(f"tries by what the receiver did: {dict(tried.most_common())}")
    assert len(messages) == EFFECTS
    assert all(settled(m) for m in messages)
    assert sent <= set(receiver.processed) <= keys  # 0 lost, nothing unknown
    assert receiver.bad_signatures == 0
    if honour or lookup:
        assert receiver.duplicates == 0
    else:
        # A copy only follows an attempt that may have arrived (uncertain, or an error after
        # processing), and it carries the same key.
        again = {k for k, n in receiver.processed.items() if n > 1}
        assert all(any(a.outcome in ("uncertain", "retry") for a in ledger.outbox.delivery_attempts(k))
                   for k in again)


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def test_objects_through_random_faults_end_final_and_never_overwritten(
        ledger: Ledger, s3: MotoS3) -> None:
    """Every object write ends sent, dead (a conflict) or uncertain; every sent one is in the
    bucket with its digest; a key that held someone else's object still holds it."""
    prefix = f"drill/{ledger.dialect}-{uuid.uuid4().hex[:8]}"
    bodies = {f"{prefix}/{i:05d}.json": f'{{"n": {i}}}' for i in range(EFFECTS)}
    taken = {key for key in bodies if random.Random(f"{SEED}:{key}").random() < CONFLICTS}
    client = s3.client()
    for key in taken:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"someone else's")
    rows = complete_with(ledger, [OutboxMessage.object(BUCKET_BLOCK, key, body)
                                  for key, body in bodies.items()])
    requests: Counter[str] = Counter()

    def chooser(method: str, path: str) -> str:
        requests[method] += 1
        faults = PUT_FAULTS if method == "PUT" else HEAD_FAULTS if method == "HEAD" else []
        return draw(f"{SEED}:{method}:{path}:{requests[method]}", faults) or PASS

    started = time.monotonic()
    with FaultyProxy(s3.port, chooser, slow_seconds=SLOW_SECONDS) as proxy:
        def through_proxy() -> Callable[[str], Any]:
            async def resolve(name: str) -> Bucket:
                block = s3.block()
                block.credentials.aws_client_parameters.endpoint_url = proxy.endpoint
                return bucket_from_block(name, block, timeout=TIMEOUT)
            return resolve

        transport = ObjectStoreTransport(through_proxy(), timeout=TIMEOUT)
        dispatcher = Dispatcher(ledger, transport, POLICY, lease_seconds=60,
                                rng=random.Random(SEED))
        passes = deliver_until_settled(ledger, dispatcher, EFFECTS)
    seconds = time.monotonic() - started
    messages = {m.message_id: m for m in ledger.outbox.messages(limit=EFFECTS + 1)}
    stored = {k: v for k, v in s3.objects().items() if k.startswith(prefix + "/")}
    print(f"\nobject storage, {ledger.dialect}: {len(messages)} effects, "
          f"{sum(m.attempts for m in messages.values())} attempts in {passes} passes "
          f"({seconds:.1f} s); final {statuses(ledger)}; {len(stored)} objects, "
          f"{len(taken)} keys taken beforehand")
    print(f"requests by what the proxy did: {dict(sorted(proxy.seen.items()))}")
    assert len(messages) == EFFECTS
    assert all(settled(m) for m in messages.values())
    by_key = {r.recipient.partition("/")[2]: r.message_id for r in rows}
    for key, message_id in by_key.items():
        message = messages[message_id]
        if key in taken:
            assert stored[key] == b"someone else's"  # never overwritten
            assert message.status == "dead" and "conflict" in (message.last_error or "")
        elif message.status == "sent":
            assert stored[key] == bodies[key].encode()  # 0 lost
    # The digest each object carries, on a seeded sample (a HEAD each is slow on moto).
    sent_keys = sorted(k for k, i in by_key.items() if messages[i].status == "sent")
    for key in random.Random(SEED).sample(sent_keys, min(100, len(sent_keys))):
        head = client.head_object(Bucket=BUCKET, Key=key)
        assert head["Metadata"][DIGEST_META] == hashlib.sha256(stored[key]).hexdigest()
    assert set(stored) <= set(bodies)


pytestmark = [pytest.mark.drill, pytest.mark.timeout(DEADLINE_SECONDS + 120)]


KILLS = 20 if FULL else 5
FORKS = mp.get_context("forkserver")
# Webhook dispatchers need httpx and Prefect (preloaded) and standardwebhooks.
FORKS.set_forkserver_preload([*PRELOAD, "standardwebhooks", "prefect.blocks.system"])
DISPATCHERS = 2


@pytest.mark.parametrize("kind", ["honours the key", "offers a lookup"])
def test_dispatchers_killed_between_acceptance_and_the_sent_mark_leave_no_duplicate(
        db_url: str, tmp_path: Path, kind: str) -> None:
    """Dispatcher processes SIGKILLed right after the receiver accepted a webhook and before its
    sent mark: the message is taken over when its lease expires, and the receiver that honours
    the key (a replay) or offers a lookup (no second POST) still processes each once."""
    honour, lookup = RECEIVERS[kind]
    rng = random.Random(SEED)
    with Ledger.connect(db_url) as ledger:
        rows = complete_with(ledger, webhooks(EFFECTS))
    stop = tmp_path / "stop"
    kills: list[str] = []
    started = time.monotonic()
    with WebhookReceiver(honour_key=honour, lookup=lookup) as receiver:
        env = {"RUNLEDGER_DATABASE_URL": db_url}
        args = (db_url, receiver.url, "1" if lookup else "0", str(stop))
        running: dict[int, tuple[BaseProcess, str | None]] = {}

        def start(index: int) -> None:
            point = (f"{AFTER_SEND_BEFORE_MARK}@{rng.randint(1, 12)}"
                     if len(kills) + len(running) < KILLS else None)
            process = FORKS.Process(target=run_armed, args=(
                point, env, "tests.support.channel_kill:dispatcher", *args))
            process.start()
            running[index] = (process, point)

        for index in range(DISPATCHERS):
            start(index)
        with Ledger.connect(db_url) as ledger:
            deadline = time.monotonic() + DEADLINE_SECONDS
            while not all(settled(m) for m in ledger.outbox.messages(limit=EFFECTS + 1)):
                assert time.monotonic() < deadline, (statuses(ledger), kills)
                for index, (process, point) in list(running.items()):
                    if process.exitcode is not None:
                        assert process.exitcode == -signal.SIGKILL, (point, process.exitcode)
                        kills.append(str(point))
                        del running[index]
                        start(index)
                time.sleep(0.1)
            stop.touch()
            for process, _ in running.values():
                process.join(30)
                if process.exitcode is None:  # armed and never reached its point: still stopped
                    process.kill()
                    process.join()
            messages = ledger.outbox.messages(limit=EFFECTS + 1)
            counts = statuses(ledger)
            taken_over = sum(1 for m in messages
                             if any(a.outcome == "sent" and a.attempt > 1
                                    for a in ledger.outbox.delivery_attempts(m.message_id)))
    seconds = time.monotonic() - started
    print(f"\nwebhook kill drill, receiver {kind}, {ledger.dialect}: {len(messages)} effects, "
          f"{len(kills)} SIGKILLs between acceptance and the sent mark, {taken_over} sent on a "
          f"later attempt, in {seconds:.1f} s; final {counts}; POSTs "
          f"{sum(receiver.posts.values())}, lookups {sum(receiver.lookups.values())}, "
          f"duplicates {receiver.duplicates}")
    assert len(kills) >= KILLS
    assert counts == {"sent": EFFECTS}
    assert set(receiver.processed) == {r.message_id for r in rows}
    assert receiver.duplicates == 0
