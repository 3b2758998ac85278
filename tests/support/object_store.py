"""A real S3-compatible server on loopback (moto in server mode; it honours ``If-None-Match: *``)
and the prefect-aws S3Bucket block that points at it."""

from __future__ import annotations

import logging
import socket
from typing import Any, Self

import boto3
from moto.server import ThreadedMotoServer
from prefect_aws import AwsCredentials, S3Bucket
from prefect_aws.client_parameters import AwsClientParameters

from flows.errors import DeliveryConfigurationError
from flows.objects.bucket import Bucket, bucket_from_block
from flows.objects.transport import ObjectStoreTransport

BUCKET = "runledger-reports"
BUCKET_BLOCK = "reports"  # the S3Bucket block name in the messages' targets


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class MotoS3:
    """moto's S3 on 127.0.0.1, on a free port, between enter and exit, with one bucket."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="test",
                            aws_secret_access_key="test", region_name="us-east-1")

    def block(self, folder: str = "", bucket: str = BUCKET) -> S3Bucket:
        """An S3Bucket block (not saved) for this server."""
        credentials = AwsCredentials(
            aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1",
            aws_client_parameters=AwsClientParameters(endpoint_url=self.endpoint))
        return S3Bucket(bucket_name=bucket, credentials=credentials, bucket_folder=folder)

    def objects(self, bucket: str = BUCKET) -> dict[str, bytes]:
        """Every object in the bucket: key -> content."""
        client = self.client()
        found: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return found

    def __enter__(self) -> Self:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.server.start()
        self.client().create_bucket(Bucket=BUCKET)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def object_transport(s3: MotoS3, timeout: float = 5.0) -> ObjectStoreTransport:
    """A transport whose bucket block ``reports`` is ``s3``'s bucket."""
    async def resolve(name: str) -> Bucket:
        if name != BUCKET_BLOCK:
            raise DeliveryConfigurationError(f"no S3Bucket block named {name!r}")
        return bucket_from_block(name, s3.block(), timeout=timeout)
    return ObjectStoreTransport(resolve, timeout=timeout)
