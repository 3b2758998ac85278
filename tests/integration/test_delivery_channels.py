"""Webhook and object-storage messages through the outbox on both ledgers: queued with the Run's
completion, claimed with a delivery lease, sent with their stable key, retried, dead or
uncertain like email, and an uncertain one settled by asking the receiver."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy, UncertainPolicy
from flows.errors import DeliveryConfigurationError
from flows.mail.sink import Sink
from flows.objects.transport import DIGEST_META
from store import Ledger, OutboxMessage, RunIdentity
from store.errors import InvalidMessage
from tests.support.channels import (
    ENDPOINT,
    FAST,
    complete_with,
    deliver_with,
    webhook_transport,
    webhooks,
)
from tests.support.delivery import deliver, statuses
from tests.support.object_store import BUCKET, BUCKET_BLOCK, MotoS3, object_transport
from tests.support.webhook_receiver import Fault, WebhookReceiver


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as found:
        yield found


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def test_each_webhook_is_queued_with_its_payload_and_posted_once(
        ledger: Ledger, receiver: WebhookReceiver) -> None:
    """The outbox row holds the JSON; the receiver gets it under the row's key, once."""
    rows = complete_with(ledger, webhooks(5))
    assert all(r.channel == "webhook" and r.payload is not None for r in rows)
    report = deliver_with(ledger, webhook_transport(receiver.url))
    assert report.counts["sent"] == 5
    assert statuses(ledger) == {"sent": 5}
    assert receiver.processed == {r.message_id: 1 for r in rows}
    assert {k: p["n"] for k, p in receiver.payloads.items()} == {
        r.message_id: r.payload["n"] for r in rows if r.payload}


def test_an_uncertain_webhook_is_settled_by_the_lookup_without_a_second_post(
        ledger: Ledger) -> None:
    """Dropped after processing: uncertain; the next attempt asks, hears 'delivered', marks sent."""
    with WebhookReceiver(honour_key=False) as receiver:
        [row] = complete_with(ledger, webhooks(1))
        receiver.script.append(Fault(drop=True))
        first = deliver_with(ledger, webhook_transport(receiver.url))
        assert (first.counts["uncertain"], first.counts["settled"]) == (1, 0)
        second = deliver_with(ledger, webhook_transport(receiver.url))
        assert (second.counts["sent"], second.counts["settled"]) == (1, 1)
        assert second.summary() == "1 sent (1 settled by asking the receiver)"
        assert "1 of the sent were settled by asking the receiver" in second.markdown()
        assert receiver.posts[row.message_id] == 1
        assert receiver.lookups[row.message_id] == 1
        assert receiver.duplicates == 0
    attempts = ledger.outbox.delivery_attempts(row.message_id)
    assert [a.outcome for a in attempts] == ["uncertain", "sent"]
    assert attempts[-1].reply_text == "delivered (status lookup)"


def test_a_lookup_that_never_saw_it_resends_with_the_same_key(ledger: Ledger) -> None:
    """A 500 before processing: retried; the lookup says 404, so the second attempt POSTs."""
    with WebhookReceiver() as receiver:
        [row] = complete_with(ledger, webhooks(1))
        receiver.script.append(Fault(status=500))
        assert deliver_with(ledger, webhook_transport(receiver.url)).counts["retry"] == 1
        resent = deliver_with(ledger, webhook_transport(receiver.url))
        assert (resent.counts["sent"], resent.counts["settled"]) == (1, 0)
        assert resent.summary() == "1 sent"
        assert statuses(ledger) == {"sent": 1}
        assert (receiver.lookups[row.message_id], receiver.posts[row.message_id]) == (1, 2)
        assert receiver.processed[row.message_id] == 1


def test_without_lookup_or_key_an_uncertain_webhook_can_arrive_twice(ledger: Ledger) -> None:
    """The documented limit: a receiver that neither honours the key nor offers a lookup gets a
    copy, with the same key, when an uncertain message is resent."""
    with WebhookReceiver(honour_key=False, lookup=False) as receiver:
        [row] = complete_with(ledger, webhooks(1))
        receiver.script.append(Fault(drop=True))
        deliver_with(ledger, webhook_transport(receiver.url, lookup=False))
        deliver_with(ledger, webhook_transport(receiver.url, lookup=False))
        assert statuses(ledger) == {"sent": 1}
        assert receiver.processed[row.message_id] == 2


def test_an_uncertain_webhook_can_be_held_for_an_operator(ledger: Ledger) -> None:
    """With the hold policy an uncertain message is never due again until requeued; a requeue
    then asks the receiver first."""
    hold = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02, max_window=3600,
                       uncertain=UncertainPolicy.HOLD)
    with WebhookReceiver(honour_key=False) as receiver:
        [row] = complete_with(ledger, webhooks(1))
        receiver.script.append(Fault(drop=True))
        deliver_with(ledger, webhook_transport(receiver.url), policy=hold)
        assert deliver_with(ledger, webhook_transport(receiver.url), policy=hold).deliveries == []
        ledger.outbox.requeue_message(row.message_id)
        assert deliver_with(ledger, webhook_transport(receiver.url), policy=hold).counts["sent"] == 1
        assert receiver.processed[row.message_id] == 1


def test_a_changed_payload_is_dead_and_a_rate_limit_waits(
        ledger: Ledger, receiver: WebhookReceiver) -> None:
    """422 ends the message dead with the reason; 429's Retry-After sets the next try."""
    rows = complete_with(ledger, webhooks(2))
    receiver.script += [Fault(status=422), Fault(status=429, retry_after="0.05")]
    report = deliver_with(ledger, webhook_transport(receiver.url))
    assert sorted(d.status.value for d in report.deliveries) == ["dead", "retry"]
    dead = next(d for d in report.deliveries if d.status.value == "dead")
    assert dead.error is not None and "another payload" in dead.error
    retried = next(d for d in report.deliveries if d.status.value == "retry")
    assert retried.delay is not None and retried.delay >= 0.05
    assert {r.message_id for r in rows} == {d.message_id for d in report.deliveries}


def test_a_missing_endpoint_block_stops_the_pass_and_counts_no_attempt(
        ledger: Ledger, receiver: WebhookReceiver) -> None:
    """A target naming no endpoint: a configuration error, the message given back untried."""
    [row] = complete_with(ledger, [OutboxMessage.webhook("unknown-endpoint", {"x": 1})])
    with pytest.raises(DeliveryConfigurationError, match="unknown-endpoint"):
        deliver_with(ledger, webhook_transport(receiver.url))
    message = ledger.outbox.message(row.message_id)
    assert message is not None and (message.status, message.attempts) == ("pending", 0)


def test_a_report_is_written_to_the_bucket_once(ledger: Ledger, s3: MotoS3) -> None:
    """The object write's body lands under its key with its digest; a second pass has nothing due."""
    key = f"daily/{ledger.dialect}-once.md"
    [row] = complete_with(ledger, [OutboxMessage.object(BUCKET_BLOCK, key, "# Report\n",
                                                        "text/markdown")])
    assert deliver_with(ledger, object_transport(s3)).counts["sent"] == 1
    assert s3.objects()[key] == b"# Report\n"
    assert deliver_with(ledger, object_transport(s3)).deliveries == []
    assert ledger.outbox.message(row.message_id).status == "sent"  # type: ignore[union-attr]


def test_an_earlier_write_that_landed_is_settled_by_head(ledger: Ledger, s3: MotoS3) -> None:
    """A retried write whose object is already there (same digest) is sent without a PUT."""
    key = f"daily/{ledger.dialect}-landed.md"
    [row] = complete_with(ledger, [OutboxMessage.object(BUCKET_BLOCK, key, "landed\n",
                                                        "text/plain")])
    with MotoS3() as down:
        stopped = object_transport(down)
    assert deliver_with(ledger, stopped).counts["retry"] == 1
    digest = hashlib.sha256(b"landed\n").hexdigest()
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"landed\n",
                           Metadata={DIGEST_META: digest})
    assert deliver_with(ledger, object_transport(s3)).counts["settled"] == 1
    attempts = ledger.outbox.delivery_attempts(row.message_id)
    assert [a.outcome for a in attempts] == ["retry", "sent"]
    assert "already stored with the same content" in (attempts[-1].reply_text or "")


def test_a_key_holding_another_object_is_dead_as_a_conflict(ledger: Ledger, s3: MotoS3) -> None:
    """Someone else's object under the key is never overwritten; the message is dead, said so."""
    key = f"daily/{ledger.dialect}-taken.md"
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"not ours")
    complete_with(ledger, [OutboxMessage.object(BUCKET_BLOCK, key, "ours", "text/plain")])
    report = deliver_with(ledger, object_transport(s3))
    [dead] = report.deliveries
    assert dead.status.value == "dead" and "conflict" in (dead.error or "")
    assert s3.objects()[key] == b"not ours"


def test_one_run_with_three_channels_is_delivered_by_one_dispatcher_each(
        ledger: Ledger, receiver: WebhookReceiver, s3: MotoS3) -> None:
    """Each dispatcher claims only its channel's rows; together they deliver the Run's effects."""
    key = f"daily/{ledger.dialect}-mixed.json"
    rows = complete_with(ledger, [
        OutboxMessage("ops@example.com", "Digest", "Hello\n"),
        OutboxMessage.webhook(ENDPOINT, {"summary": "ok"}),
        OutboxMessage.object(BUCKET_BLOCK, key, '{"summary": "ok"}'),
    ])
    assert {r.channel for r in rows} == {"email", "webhook", "object"}
    web = Dispatcher(ledger, webhook_transport(receiver.url), FAST)
    obj = Dispatcher(ledger, object_transport(s3), FAST)

    async def both() -> None:
        await asyncio.gather(web.run_pass(), obj.run_pass())

    asyncio.run(both())
    assert statuses(ledger) == {"pending": 1, "sent": 2}  # the email waits for its dispatcher
    assert key in s3.objects() and len(receiver.processed) == 1


def test_bad_effects_are_refused_and_nothing_is_written(ledger: Ledger) -> None:
    """A bad key among a Run's messages is refused before the completion: no row is written."""
    with pytest.raises(InvalidMessage, match=r"'\.\.'"):
        complete_with(ledger, [OutboxMessage.webhook(ENDPOINT, {"ok": 1}),
                               OutboxMessage.object(BUCKET_BLOCK, "../escape.md", "x")])
    assert statuses(ledger) == {}


def test_an_email_queued_before_the_channels_migration_is_delivered_after_it(
        empty_db_url: str) -> None:
    """A row written by the 0008 schema (no payload column) is claimed and sent after 0009."""
    with Ledger.connect(empty_db_url) as old:
        old.migrate("0008")
        identity = RunIdentity("digest", "before-0009", datetime(2026, 1, 5, 9, tzinfo=UTC), "v1")
        old.register(identity)
        with old.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body, "
                "headers, status, attempts, fence, next_attempt_at, created_at, updated_at) "
                "VALUES (:id, :run, 'email', 'ops@example.com', 'Old', 'Hello', NULL, 'pending', "
                "0, 0, :now, :now, :now)"),
                {"id": "e" * 64, "run": identity.run_id, "now": datetime.now(UTC)})
        old.migrate()
        [row] = old.outbox.messages()
        assert (row.channel, row.payload) == ("email", None)
        with Sink() as sink:
            assert deliver(old, sink).counts["sent"] == 1
        assert [m.rcpt_tos for m in sink.messages] == [("ops@example.com",)]
