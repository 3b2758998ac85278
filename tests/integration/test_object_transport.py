"""The object-storage transport against a real S3-compatible server on loopback (moto): a
conditional write per message, a 412 read by its digest, and HEAD settling an uncertain write."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from flows.errors import DeliveryConfigurationError
from flows.objects.bucket import Bucket, bucket_from_block
from flows.objects.transport import DIGEST_META, KEY_META, ObjectStoreTransport
from flows.transport import OutcomeKind, Parcel, SendOutcome
from tests.support.object_store import BUCKET, MotoS3

KEY = "b" * 64
REPORT = {"body": "# Daily report\n\nAll good.\n", "content_type": "text/markdown"}


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def parcel(target: str, body: str = REPORT["body"], key: str = KEY) -> Parcel:
    return Parcel(key=key, channel="object", target=target,
                  payload={"body": body, "content_type": "text/markdown"},
                  created_at=datetime(2026, 12, 3, tzinfo=UTC))


def transport(s3: MotoS3, folder: str = "") -> ObjectStoreTransport:
    async def resolve(name: str) -> Bucket:
        if name != "reports":
            raise DeliveryConfigurationError(f"no S3Bucket block named {name!r}")
        return bucket_from_block(name, s3.block(folder), timeout=5.0)
    return ObjectStoreTransport(resolve, timeout=5.0)


def send(t: ObjectStoreTransport, p: Parcel) -> SendOutcome:
    return asyncio.run(t.send(p))


def test_a_report_is_written_once_with_its_key_and_digest(s3: MotoS3) -> None:
    """The object holds the body, its content type and the message's key and sha256."""
    outcome = send(transport(s3), parcel("reports/daily/first.md"))
    assert outcome.kind is OutcomeKind.SENT
    head = s3.client().head_object(Bucket=BUCKET, Key="daily/first.md")
    assert head["ContentType"] == "text/markdown"
    assert head["Metadata"][KEY_META] == KEY
    assert len(head["Metadata"][DIGEST_META]) == 64
    assert s3.objects()["daily/first.md"] == REPORT["body"].encode()


def test_a_second_write_of_the_same_content_is_sent_not_a_copy(s3: MotoS3) -> None:
    """The store refuses the second PUT (412); the same digest means an earlier write landed."""
    t = transport(s3)
    assert send(t, parcel("reports/daily/again.md")).kind is OutcomeKind.SENT
    outcome = send(t, parcel("reports/daily/again.md"))
    assert outcome.kind is OutcomeKind.SENT
    assert "already stored with the same content" in outcome.summary


def test_another_object_under_the_key_is_a_permanent_conflict(s3: MotoS3) -> None:
    """A different digest under the key is never overwritten and is said so."""
    s3.client().put_object(Bucket=BUCKET, Key="daily/taken.md", Body=b"someone else's")
    outcome = send(transport(s3), parcel("reports/daily/taken.md"))
    assert outcome.kind is OutcomeKind.PERMANENT
    assert "conflict" in outcome.summary and "not overwritten" in outcome.summary
    assert s3.objects()["daily/taken.md"] == b"someone else's"


def test_the_blocks_folder_prefixes_the_key(s3: MotoS3) -> None:
    """An S3Bucket block's bucket_folder is where the channel's keys start."""
    assert send(transport(s3, folder="runledger/"), parcel("reports/x.md")).kind is OutcomeKind.SENT
    assert "runledger/x.md" in s3.objects()


def test_head_settles_an_uncertain_write(s3: MotoS3) -> None:
    """HEAD: this message's object there is sent, nothing there means send, another is a conflict."""
    t = transport(s3)
    assert asyncio.run(t.settle(parcel("reports/settle/absent.md"))) is None
    send(t, parcel("reports/settle/present.md"))
    settled = asyncio.run(t.settle(parcel("reports/settle/present.md")))
    assert settled is not None and settled.kind is OutcomeKind.SENT
    changed = asyncio.run(t.settle(parcel("reports/settle/present.md", body="other")))
    assert changed is not None and changed.kind is OutcomeKind.PERMANENT


def test_a_missing_bucket_is_a_configuration_error(s3: MotoS3) -> None:
    """NoSuchBucket stops delivery as misconfigured, naming the bucket block."""
    async def resolve(name: str) -> Bucket:
        return bucket_from_block(name, s3.block(bucket="no-such-bucket"), timeout=5.0)
    with pytest.raises(DeliveryConfigurationError, match="reports"):
        send(ObjectStoreTransport(resolve), parcel("reports/x.md"))


def test_a_server_that_is_down_is_transient() -> None:
    """Connection refused: nothing was written, a retry is safe."""
    with MotoS3() as gone:
        t = transport(gone)
    outcome = send(t, parcel("reports/down.md"))
    assert outcome.kind is OutcomeKind.TRANSIENT


def test_plain_http_off_loopback_is_refused(s3: MotoS3) -> None:
    """An S3-compatible endpoint off loopback must use https."""
    block = s3.block()
    block.credentials.aws_client_parameters.endpoint_url = "http://s3.example.com"
    with pytest.raises(DeliveryConfigurationError, match="https unless the host is loopback"):
        bucket_from_block("reports", block, timeout=5.0)
