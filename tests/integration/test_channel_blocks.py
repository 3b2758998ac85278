"""The channels' Prefect blocks on a real Prefect server: a webhook endpoint whose secret lives
in a Secret block, an S3Bucket block pointing at moto on loopback, the transports the delivery
settings open from them, and a message naming a block that does not exist refused before
anything is written."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prefect.blocks.system import Secret

from flows.delivery.flow import deliver_outbox
from flows.delivery.settings import DeliverySettings, open_transport
from flows.errors import DeliveryConfigurationError
from flows.mail.sink import Sink
from flows.objects import bucket as bucket_module
from flows.objects.bucket import Bucket, bucket_from_block, load_bucket
from flows.targets import InvalidBlock, MissingBlock, check_targets
from flows.transport import OutcomeKind, Parcel
from flows.webhook.block import WebhookEndpoint, load_endpoint
from store import Ledger, OutboxMessage
from tests.support.channels import complete_with
from tests.support.delivery import SENDER, statuses
from tests.support.object_store import BUCKET, MotoS3
from tests.support.pipeline import final_state
from tests.support.webhook_receiver import SECRET, WebhookReceiver

pytestmark = pytest.mark.usefixtures("prefect_api")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def test_an_endpoint_block_resolves_with_its_secret_from_a_secret_block() -> None:
    """The endpoint's settings carry the Secret block's value, and describe() does not."""
    secret, endpoint = unique("hook-secret"), unique("reports-api")
    Secret(value=SECRET).save(secret)
    WebhookEndpoint(url="https://hooks.example.com/in", secret_block=secret,
                    lookup_url="{url}/{key}", key_retention_hours=24).save(endpoint)
    settings = asyncio.run(load_endpoint(endpoint))
    assert settings.secret is not None and settings.secret.get_secret_value() == SECRET
    assert settings.lookup_for("k1") == "https://hooks.example.com/in/k1"
    assert SECRET not in settings.describe() and SECRET not in repr(settings)


def test_a_plain_http_endpoint_off_loopback_is_refused_at_delivery() -> None:
    """A block whose URL is http off loopback is a configuration error naming the endpoint."""
    endpoint = unique("reports-api")
    WebhookEndpoint(url="http://hooks.example.com/in").save(endpoint)
    with pytest.raises(DeliveryConfigurationError, match="https unless the host is loopback"):
        asyncio.run(load_endpoint(endpoint))


def test_missing_blocks_are_configuration_errors_naming_them() -> None:
    """A missing endpoint, secret or bucket block is named in the error."""
    with pytest.raises(DeliveryConfigurationError, match="no webhook endpoint block named"):
        asyncio.run(load_endpoint(unique("absent")))
    endpoint = unique("reports-api")
    WebhookEndpoint(url="https://hooks.example.com/in", secret_block="no-such-secret").save(endpoint)
    with pytest.raises(DeliveryConfigurationError, match="'no-such-secret' does not exist"):
        asyncio.run(load_endpoint(endpoint))
    with pytest.raises(DeliveryConfigurationError, match="no S3Bucket block named"):
        asyncio.run(load_bucket(unique("absent"), 5.0))


def test_a_bucket_block_becomes_a_client_off_the_event_loop(
        s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the boto3 client (a second or more of CPU reading botocore's models) runs in a
    worker thread, so that the other channels' sends on the loop go on meanwhile."""
    name = unique("reports")
    s3.block().save(name)
    made_on: list[threading.Thread] = []

    def recorded(*args: Any) -> Bucket:
        made_on.append(threading.current_thread())
        return bucket_from_block(*args)

    monkeypatch.setattr(bucket_module, "bucket_from_block", recorded)

    async def load() -> tuple[Bucket, threading.Thread]:
        return await load_bucket(name, 5.0), threading.current_thread()

    found, loop_thread = asyncio.run(load())
    assert found.name == name and len(made_on) == 1 and made_on[0] is not loop_thread


def test_the_delivery_settings_open_transports_that_send_through_the_blocks(
        s3: MotoS3) -> None:
    """open_transport's webhook and object transports load their blocks and deliver."""
    secret, endpoint, bucket = unique("hook-secret"), unique("reports-api"), unique("reports")
    Secret(value=SECRET).save(secret)
    s3.block().save(bucket)
    settings = DeliverySettings(channels="email,webhook,object")
    with WebhookReceiver() as receiver:
        WebhookEndpoint(url=receiver.url, secret_block=secret, lookup_url="{url}/{key}",
                        timeout=10).save(endpoint)
        webhook = open_transport(settings, "webhook")
        sent = asyncio.run(webhook.send(Parcel("k" * 64, "webhook", endpoint, {"x": 1},
                                               datetime.now(UTC))))
        assert sent.kind is OutcomeKind.SENT and receiver.processed["k" * 64] == 1
    objects = open_transport(settings, "object")
    key = unique("daily") + ".md"
    written = asyncio.run(objects.send(Parcel("o" * 64, "object", f"{bucket}/{key}",
                                              {"body": "# r\n", "content_type": "text/markdown"},
                                              datetime.now(UTC))))
    assert written.kind is OutcomeKind.SENT
    assert s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"# r\n"


def test_a_message_naming_a_missing_block_is_refused_before_the_completion(s3: MotoS3) -> None:
    """check_targets names a missing block (MissingBlock), and one that exists but cannot be
    used (InvalidBlock: a plain-http webhook URL or bucket endpoint off loopback); usable ones
    pass."""
    endpoint, bucket = unique("reports-api"), unique("reports")
    WebhookEndpoint(url="https://hooks.example.com/in").save(endpoint)
    s3.block().save(bucket)
    check_targets([OutboxMessage.webhook(endpoint, {"x": 1}),
                   OutboxMessage.object(bucket, "a.md", "x", "text/markdown")])
    with pytest.raises(MissingBlock, match=r"'nowhere-api'.*Nothing was written"):
        check_targets([OutboxMessage.webhook("nowhere-api", {"x": 1})])
    with pytest.raises(MissingBlock, match="S3Bucket block 'no-bucket'"):
        check_targets([OutboxMessage.object("no-bucket", "a.md", "x", "text/markdown")])
    plain = unique("plain-api")
    WebhookEndpoint(url="http://hooks.example.com/in").save(plain)
    with pytest.raises(InvalidBlock, match="https unless the host is loopback"):
        check_targets([OutboxMessage.webhook(plain, {"x": 1})])
    plain_bucket, block = unique("plain-bucket"), s3.block()
    block.credentials.aws_client_parameters.endpoint_url = "http://s3.example.com"
    block.save(plain_bucket)
    with pytest.raises(InvalidBlock, match=r"endpoint_url must use https unless the host "
                                           r"is loopback.*Nothing was written"):
        check_targets([OutboxMessage.object(plain_bucket, "a.md", "x", "text/markdown")])


@pytest.mark.timeout(300)
def test_one_flow_run_delivers_every_channel_it_is_given(
        db_url: str, ledger: Ledger, s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """deliver-outbox with RUNLEDGER_DELIVERY_CHANNELS=email,webhook,object runs one dispatcher
    per channel: the Run's email, webhook and object write are all sent by one flow run, and the
    artifact has a section per channel."""
    secret, endpoint, bucket = unique("hook-secret"), unique("reports-api"), unique("reports")
    Secret(value=SECRET).save(secret)
    s3.block().save(bucket)
    key = unique("daily") + ".json"
    with WebhookReceiver() as receiver, Sink() as sink:
        WebhookEndpoint(url=receiver.url, secret_block=secret, lookup_url="{url}/{key}",
                        timeout=10).save(endpoint)
        complete_with(ledger, [OutboxMessage("ops@example.com", "Digest", "Hello\n"),
                               OutboxMessage.webhook(endpoint, {"summary": "ok"}),
                               OutboxMessage.object(bucket, key, '{"summary": "ok"}')])
        for name, value in {"RUNLEDGER_DATABASE_URL": db_url, "RUNLEDGER_SMTP_HOST": sink.host,
                            "RUNLEDGER_SMTP_PORT": str(sink.port), "RUNLEDGER_SMTP_TLS": "none",
                            "RUNLEDGER_MAIL_FROM": SENDER,
                            "RUNLEDGER_DELIVERY_CHANNELS": "email,webhook,object"}.items():
            monkeypatch.setenv(name, value)
        state = final_state(deliver_outbox(batch_size=10, max_seconds=30, return_state=True))
        assert state.is_completed(), state.message
        assert state.result()["sent"] == 3
        assert len(sink.messages) == 1 and len(receiver.processed) == 1
    assert key in s3.objects()
    assert statuses(ledger) == {"sent": 3}
