"""One webhook endpoint's settings: where to POST, the Standard Webhooks signing secret, the
optional status lookup, and how long the receiver remembers a key. HTTPS is required unless the
host is loopback; the secret is never printed."""

from __future__ import annotations

import base64
import binascii
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from flows.transport import is_loopback

SECRET_PREFIX = "whsec_"
KEY_PLACEHOLDER = "{key}"
URL_PLACEHOLDER = "{url}"


def https_url(value: str, what: str) -> str:
    """An http(s) URL with a host; plain http only for a loopback host."""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"{what} must be an http(s) URL, got {value!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(f"{what} must use https unless the host is loopback, got {value!r}")
    return value


class WebhookSettings(BaseModel):
    """Everything the webhook transport needs for one endpoint."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="The endpoint's name: an outbox message's target.")
    url: str = Field(description="Where the JSON is POSTed (https unless loopback).")
    secret: SecretStr | None = Field(
        default=None, description="Standard Webhooks secret (``whsec_`` + base64); None sends "
                                  "unsigned requests (e.g. Slack incoming webhooks).")
    lookup_url: str | None = Field(
        default=None,
        description="Status lookup, a template with ``{key}`` (and optionally ``{url}``), e.g. "
                    "``{url}/{key}``: GET answers 200 delivered, 404 never seen. None: the "
                    "receiver offers no lookup.")
    key_retention_hours: float | None = Field(
        default=None, gt=0,
        description="How long the receiver remembers an Idempotency-Key; the retry window may "
                    "not be longer. None: it promises nothing.")
    timeout: float = Field(default=30.0, gt=0, le=900,
                           description="Seconds to wait for the receiver's answer.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return https_url(value, "the webhook url")

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        raw = value.get_secret_value().removeprefix(SECRET_PREFIX)
        try:
            decoded = base64.b64decode(raw + "==", validate=False)
        except (binascii.Error, ValueError):
            decoded = b""
        if not raw or not decoded:
            # The value itself is never repeated: it is a secret.
            raise ValueError("the signing secret must be whsec_ followed by base64 bytes")
        return value

    @model_validator(mode="after")
    def _lookup(self) -> WebhookSettings:
        if self.lookup_url is not None:
            if KEY_PLACEHOLDER not in self.lookup_url:
                raise ValueError(f"the lookup url must contain {KEY_PLACEHOLDER}, got "
                                 f"{self.lookup_url!r}")
            https_url(self.lookup_for("k"), "the lookup url")
        return self

    def lookup_for(self, key: str) -> str:
        """The status lookup URL of the message whose key is ``key``."""
        assert self.lookup_url is not None
        return self.lookup_url.replace(URL_PLACEHOLDER, self.url.rstrip("/")).replace(
            KEY_PLACEHOLDER, key)

    @property
    def key_retention_seconds(self) -> float | None:
        return None if self.key_retention_hours is None else self.key_retention_hours * 3600

    def describe(self) -> str:
        """Where it goes, for logs (never the secret)."""
        lookup = "with lookup" if self.lookup_url else "no lookup"
        # Host only: a path may hold a token (Slack puts one in its webhook URLs).
        return f"webhook {self.name} -> {urlsplit(self.url).hostname} ({lookup})"
