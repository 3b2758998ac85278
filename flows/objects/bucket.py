"""A bucket the object-storage channel writes to: a ``prefect-aws`` S3Bucket block (its
AwsCredentials or MinIOCredentials, and their endpoint URL for an S3-compatible server) turned
into one boto3 client with the channel's own timeouts and no hidden retries: the outbox's retry
policy decides."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from botocore.config import Config
from prefect_aws import S3Bucket

from flows.errors import DeliveryConfigurationError
from flows.objects.endpoint import check_endpoint


@dataclass(frozen=True)
class Bucket:
    """Where one bucket block's objects go, and the client that writes them."""

    name: str  # the block's name: the first part of a message's target
    bucket: str
    folder: str
    client: Any  # a boto3 S3 client (thread-safe)
    endpoint: str

    def object_key(self, key: str) -> str:
        """The full key in the bucket: the block's folder, then the message's key."""
        return f"{self.folder.strip('/')}/{key}" if self.folder.strip("/") else key

    def describe(self) -> str:
        return f"bucket {self.name} -> {self.endpoint}/{self.bucket}/{self.folder.strip('/')}"


def client_config(timeout: float) -> Config:
    """One try per call (the ledger's policy retries), the channel's timeouts."""
    return Config(connect_timeout=timeout, read_timeout=timeout,
                  retries={"total_max_attempts": 1, "mode": "standard"})


def bucket_from_block(name: str, block: S3Bucket, timeout: float) -> Bucket:
    """The Bucket an S3Bucket block describes."""
    credentials = block.credentials
    params: dict[str, Any] = credentials.aws_client_parameters.get_params_override()
    endpoint = check_endpoint(name, params.get("endpoint_url"))
    params["config"] = (params["config"].merge(client_config(timeout)) if "config" in params
                        else client_config(timeout))
    client = credentials.get_boto3_session().client("s3", **params)
    return Bucket(name=name, bucket=block.bucket_name, folder=block.bucket_folder or "",
                  client=client, endpoint=endpoint)


async def load_bucket(name: str, timeout: float) -> Bucket:
    """The S3Bucket block called ``name`` as a Bucket; a missing block is a clear error."""
    try:
        block: object = await S3Bucket.aload(name)
    except ValueError as exc:
        raise DeliveryConfigurationError(
            f"no S3Bucket block named {name!r}; create one (prefect-aws 'S3 Bucket' block with "
            "its AWS or MinIO credentials) or fix the message's target") from exc
    if not isinstance(block, S3Bucket):
        raise DeliveryConfigurationError(f"block {name!r} is not an S3Bucket block")
    # In a thread: making a boto3 client reads botocore's service models for a second or more
    # of CPU, which on the event loop would stall the other channels' sends (a webhook's POST
    # ran past its timeout and ended uncertain).
    return await asyncio.to_thread(bucket_from_block, name, block, timeout)
