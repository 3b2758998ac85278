"""The shipped competitor-summary job with a webhook and object storage besides email, through
the real run-job flow and one delivery pass per channel: blocks on the session's Prefect server,
a webhook receiver and moto's S3 on loopback, an SMTP sink."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from prefect.blocks.system import Secret

from flows.delivery.dispatcher import Dispatcher
from flows.mail.sink import Sink
from flows.webhook.block import WebhookEndpoint
from tests.support.delivery import SENDER, statuses
from tests.support.object_store import BUCKET, MotoS3
from tests.support.pipeline import Env
from tests.support.webhook_receiver import SECRET, WebhookReceiver

PERIOD = "2026-01-05"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def test_a_summary_is_emailed_posted_and_written_once_each(
        env: Env, s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each workspace's Run queues its emails, one webhook and one object write with its
    completion; one pass per channel delivers them all, and a rerun queues nothing more."""
    suffix = uuid.uuid4().hex[:8]
    secret, endpoint, bucket = f"hook-secret-{suffix}", f"summaries-{suffix}", f"reports-{suffix}"
    Secret(value=SECRET).save(secret)
    s3.block(folder="runledger").save(bucket)
    with WebhookReceiver() as receiver, Sink() as sink:
        WebhookEndpoint(url=receiver.url, secret_block=secret, lookup_url="{url}/{key}",
                        timeout=10).save(endpoint)
        env.set(competitor_summary_webhook=endpoint, competitor_summary_bucket=bucket,
                delivery_channels="email,webhook,object", smtp_host=sink.host,
                smtp_port=sink.port, smtp_tls="none", mail_from=SENDER)
        state, _ = env.run("competitor-summary", period=PERIOD)
        assert state.is_completed(), state.message
        rows = env.ledger.outbox.messages(limit=100)
        by_channel = {c: sum(1 for m in rows if m.channel == c) for c in ("email", "webhook", "object")}
        assert by_channel == {"email": 3, "webhook": 2, "object": 2}  # acme has 2 subscribers

        async def deliver() -> None:
            await asyncio.gather(*[d.run_pass() for d in Dispatcher.for_channels(env.ledger)])

        asyncio.run(deliver())
        assert statuses(env.ledger) == {"sent": 7}
        assert len(sink.messages) == 3
        assert sorted(p["workspace"] for p in receiver.payloads.values()) == ["acme", "globex"]
        assert receiver.duplicates == 0
        again, _ = env.run("competitor-summary", period=PERIOD)
        assert again.is_completed() and len(env.ledger.outbox.messages(limit=100)) == 7
    objects = s3.objects(BUCKET)
    for workspace in ("acme", "globex"):
        report = objects[f"runledger/competitor-summary/{workspace}/{PERIOD}.md"].decode()
        assert report.startswith(f"# Competitor summary for {workspace}, {PERIOD}")


def test_a_missing_webhook_block_refuses_the_tick_and_queues_nothing(env: Env) -> None:
    """A job whose targets name an endpoint block that does not exist: no Run completed, no
    outbox row, no model call, and the error names the block."""
    env.set(competitor_summary_webhook=f"absent-{uuid.uuid4().hex[:8]}")
    state, error = env.run("competitor-summary", period=PERIOD)
    assert env.ledger.outbox.messages(limit=10) == []
    assert all(r.status != "completed" for r in env.ledger.runs())
    assert "absent-" in (state.message or "") + str(error)
    assert env.model_calls() == 0
