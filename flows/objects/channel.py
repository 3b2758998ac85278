"""The object-storage channel's definition: its RUNLEDGER_DELIVERY_OBJECT_TIMEOUT setting, its
target (a prefect-aws S3Bucket block's name, then the object key; usable when the block's
endpoint is https or loopback) and its transport."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.channel import Channel, Opening, TargetBlock
from flows.objects.endpoint import check_endpoint
from flows.transport import Transport
from store import OBJECT, split_object_target

if TYPE_CHECKING:
    from prefect_aws import S3Bucket


class ObjectDeliverySettings(BaseSettings):
    """How long the object channel waits for S3."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_DELIVERY_", extra="ignore")

    object_timeout: float = Field(
        default=30.0, gt=0, le=300,
        description="Seconds to wait for each S3 request (PUT, HEAD).")


def open_objects(settings: ObjectDeliverySettings, opening: Opening) -> Transport[Any]:
    """Writes to the buckets each message's target names."""
    # Imported here, when a delivery pass opens the channel: prefect_aws and botocore cost
    # every process (each CLI call, each flow run) about 0.6 s of CPU as it starts.
    from flows.objects.bucket import Bucket, load_bucket
    from flows.objects.transport import ObjectStoreTransport

    timeout = settings.object_timeout

    async def bucket(name: str) -> Bucket:
        return await load_bucket(name, timeout)

    return ObjectStoreTransport(bucket, timeout=timeout)


def check_bucket_block(name: str, found: S3Bucket) -> None:
    """Its endpoint URL rules."""
    params = found.credentials.aws_client_parameters.get_params_override()
    check_endpoint(name, params.get("endpoint_url"))


def bucket_of(target: str) -> str:
    """An object write's target is its bucket block's name, '/', the key."""
    return split_object_target(target)[0]


CHANNEL = Channel(
    name=OBJECT, settings=ObjectDeliverySettings, open=open_objects, block_of=bucket_of,
    block=TargetBlock("S3Bucket", "prefect_aws:S3Bucket", check_bucket_block))
