"""A bucket block's endpoint URL rules, apart from the bucket's client: the channel checks a
target's block with them before anything is written, without importing boto3."""

from __future__ import annotations

from urllib.parse import urlsplit

from flows.errors import DeliveryConfigurationError
from flows.transport import is_loopback


def check_endpoint(name: str, endpoint_url: str | None) -> str:
    """The block's endpoint URL, https unless its host is loopback (None: AWS itself)."""
    if endpoint_url is None:
        return "https://s3.amazonaws.com"
    parts = urlsplit(endpoint_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeliveryConfigurationError(
            f"bucket block {name!r}: endpoint_url must be an http(s) URL, got {endpoint_url!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise DeliveryConfigurationError(
            f"bucket block {name!r}: endpoint_url must use https unless the host is loopback, "
            f"got {endpoint_url!r}")
    return endpoint_url
