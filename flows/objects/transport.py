"""The object-storage transport: ``PUT`` the report with ``If-None-Match: *``, so the store
refuses a second object under the key. A 412 is read by ``HEAD``: the same content digest means
an earlier attempt's write landed (sent), another digest a conflict (permanent, said so). Replies
are classified like the webhook's: throttling, 5xx and connection errors transient; 401/403 and
a missing bucket a configuration error; other 4xx permanent; a timeout or a dropped connection
after the request left ambiguous, settled by ``HEAD`` before the next try."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
)

from flows.errors import DeliveryConfigurationError
from flows.objects.bucket import Bucket
from flows.transport import OutcomeKind, Parcel, SendOutcome
from store import MessageClaim, Reply, split_object_target

log = logging.getLogger("runledger.delivery.objects")

Resolver = Callable[[str], Awaitable[Bucket]]
KEY_META = "runledger-key"
DIGEST_META = "runledger-sha256"
_CONFIGURATION = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                            "NoSuchBucket", "AllAccessDisabled", "InvalidBucketName"})
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                        "ConditionalRequestConflict", "OperationAborted"})


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def content(parcel: Parcel) -> tuple[bytes, str, str]:
    """The object's bytes, its content type and their sha256 (hex)."""
    body = str(parcel.payload["body"]).encode("utf-8")
    return body, str(parcel.payload["content_type"]), hashlib.sha256(body).hexdigest()


class ObjectStoreTransport:
    """Writes object Parcels; each message's target names its bucket block and key."""

    name = "object storage"
    channel = "object"

    def __init__(self, resolve: Resolver, *, timeout: float = 30.0) -> None:
        self._resolve = resolve
        self.timeout = timeout
        self._buckets: dict[str, Bucket] = {}

    @property
    def key_retention_seconds(self) -> float | None:
        return None  # the object itself is the record: no expiry to outlast

    @property
    def send_reserve_seconds(self) -> float:
        return 3 * self.timeout  # HEAD, PUT, and the HEAD that reads a 412

    async def bucket(self, name: str) -> Bucket:
        found = self._buckets.get(name)
        if found is None:
            found = self._buckets[name] = await self._resolve(name)
            log.info("resolved %s", found.describe())
        return found

    def render(self, claim: MessageClaim) -> Parcel:
        return Parcel.from_claim(claim)

    async def aclose(self) -> None:
        self._buckets.clear()

    async def _where(self, parcel: Parcel) -> tuple[Bucket, str]:
        block, key = split_object_target(parcel.target)
        bucket = await self.bucket(block)
        return bucket, bucket.object_key(key)

    async def send(self, parcel: Parcel) -> SendOutcome:
        bucket, key = await self._where(parcel)
        body, content_type, digest = content(parcel)
        try:
            await asyncio.to_thread(
                bucket.client.put_object, Bucket=bucket.bucket, Key=key, Body=body,
                ContentType=content_type, IfNoneMatch="*",
                Metadata={KEY_META: parcel.key, DIGEST_META: digest})
        except ClientError as exc:
            if _status(exc) == 412:
                return await self._existing(bucket, key, digest)
            return self._refused(bucket, key, exc)
        except (EndpointConnectionError, ConnectTimeoutError) as exc:
            return SendOutcome(OutcomeKind.TRANSIENT, error=(
                f"could not reach {bucket.endpoint}: {type(exc).__name__}: {exc}"))
        except (BotoCoreError, OSError) as exc:
            return SendOutcome(OutcomeKind.AMBIGUOUS, error=(
                f"{bucket.describe()} did not answer after the object was sent (it may have "
                f"stored it): {type(exc).__name__}: {exc}"))
        return SendOutcome(OutcomeKind.SENT, Reply(code=200, text=f"stored {key}"))

    def _refused(self, bucket: Bucket, key: str, exc: ClientError) -> SendOutcome:
        status, code = _status(exc), _code(exc)
        reply = Reply(code=status or None, text=f"{code}: {exc}"[:300])
        if status in (401, 403) or code in _CONFIGURATION:
            raise DeliveryConfigurationError(
                f"{bucket.describe()} refused the write ({status} {code}); check the block's "
                "credentials, bucket name and permissions")
        if code in _THROTTLED or status in (408, 409, 429) or status >= 500:
            return SendOutcome(OutcomeKind.TRANSIENT, reply)
        return SendOutcome(OutcomeKind.PERMANENT, reply)

    async def _existing(self, bucket: Bucket, key: str, digest: str) -> SendOutcome:
        """After a 412: what the object already under ``key`` means for this message."""
        try:
            head: dict[str, Any] = await asyncio.to_thread(
                bucket.client.head_object, Bucket=bucket.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                # Refused as existing, then gone (deleted meanwhile): try again later.
                return SendOutcome(OutcomeKind.TRANSIENT, error=f"{key} vanished after a 412")
            return SendOutcome(OutcomeKind.AMBIGUOUS, error=f"HEAD {key} failed: {exc}")
        except (BotoCoreError, OSError) as exc:
            return SendOutcome(OutcomeKind.AMBIGUOUS, error=f"HEAD {key} failed: {exc}")
        return self._judge(bucket, key, digest, head)

    def _judge(self, bucket: Bucket, key: str, digest: str, head: dict[str, Any]) -> SendOutcome:
        """The same content digest is this message (sent); another one is a conflict."""
        found = (head.get("Metadata") or {}).get(DIGEST_META)
        if found == digest:
            return SendOutcome(OutcomeKind.SENT, Reply(
                code=200, text=f"{key} already stored with the same content"))
        return SendOutcome(OutcomeKind.PERMANENT, Reply(code=412, text="conflict"), error=(
            f"conflict: {bucket.bucket}/{key} already holds another object (sha256 "
            f"{found or 'unknown'}, this message's is {digest}); it was not overwritten"))

    async def settle(self, parcel: Parcel) -> SendOutcome | None:
        """``HEAD`` the key: SENT if this message's object is there, None if nothing is (send
        it), PERMANENT if another object holds the key, AMBIGUOUS if the store cannot say."""
        bucket, key = await self._where(parcel)
        _, _, digest = content(parcel)
        try:
            head: dict[str, Any] = await asyncio.to_thread(
                bucket.client.head_object, Bucket=bucket.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            if _status(exc) in (401, 403):
                return self._refused(bucket, key, exc)
            return SendOutcome(OutcomeKind.AMBIGUOUS, error=f"HEAD {key} failed: {exc}")
        except (BotoCoreError, OSError) as exc:
            return SendOutcome(OutcomeKind.AMBIGUOUS, error=f"HEAD {key} failed: {exc}")
        return self._judge(bucket, key, digest, head)
