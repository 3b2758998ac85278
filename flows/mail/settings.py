"""Transport settings from the environment: RUNLEDGER_SMTP_* and RUNLEDGER_MAIL_FROM for SMTP,
RUNLEDGER_PROVIDER_* for the HTTP provider. TLS is required unless the host is loopback."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.mail.errors import MailConfigurationError
from flows.settings import settings_problems
from flows.transport import is_loopback
from store import normalize_address

S = TypeVar("S", bound=BaseSettings)

RESEND_URL = "https://api.resend.com"
RESEND_KEY_RETENTION_HOURS = 24.0


class TlsMode(StrEnum):
    """How the SMTP connection is encrypted: ``tls`` (implicit, port 465), ``starttls`` (required
    upgrade, port 587) or ``none`` (loopback only)."""

    NONE = "none"
    STARTTLS = "starttls"
    TLS = "tls"


DEFAULT_PORTS = {TlsMode.NONE: 25, TlsMode.STARTTLS: 587, TlsMode.TLS: 465}


def _sender(value: str) -> str:
    return normalize_address(value, "the sender address")


class SmtpSettings(BaseSettings):
    """Where and how to send over SMTP. Certificates are always verified (``ca_file`` adds a
    trusted CA, e.g. a local test CA); the password is a secret and never printed."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_SMTP_", extra="ignore",
                                      populate_by_name=True)

    host: str = Field(default="127.0.0.1", description="SMTP host name or address.")
    port: int | None = Field(
        default=None, ge=1, le=65535,
        description="SMTP port; default 465 for ``tls``, 587 for ``starttls``, 25 for ``none``.")
    tls: TlsMode = Field(
        default=TlsMode.STARTTLS,
        description="``tls`` (implicit), ``starttls`` (required upgrade) or ``none`` "
                    "(loopback hosts only).")
    username: str | None = Field(default=None, description="AUTH login name (with the password).")
    password: SecretStr | None = Field(
        default=None, description="AUTH password (with the username); never logged.")
    timeout: float = Field(default=60.0, gt=0, le=900,
                           description="Seconds to wait for each SMTP reply.")
    ca_file: Path | None = Field(
        default=None, description="PEM file of an extra trusted CA (certificates are always "
                                  "verified).")
    mail_from: str = Field(validation_alias="RUNLEDGER_MAIL_FROM",
                           description="The From address of every message.")

    @field_validator("mail_from")
    @classmethod
    def _valid_sender(cls, value: str) -> str:
        return _sender(value)

    @model_validator(mode="after")
    def _tls_off_loopback_only(self) -> SmtpSettings:
        if not self.host.strip() or any(c.isspace() for c in self.host):
            raise ValueError(f"RUNLEDGER_SMTP_HOST must be a host name or address, got {self.host!r}")
        if self.tls is TlsMode.NONE and not is_loopback(self.host):
            raise ValueError(
                f"RUNLEDGER_SMTP_TLS=none is allowed only for a loopback host; {self.host} "
                "needs RUNLEDGER_SMTP_TLS=starttls or tls"
            )
        if (self.username is None) != (self.password is None):
            raise ValueError("set both RUNLEDGER_SMTP_USERNAME and RUNLEDGER_SMTP_PASSWORD, or neither")
        if self.ca_file is not None and not self.ca_file.is_file():
            raise ValueError(f"RUNLEDGER_SMTP_CA_FILE {self.ca_file} is not a readable file")
        return self

    @property
    def effective_port(self) -> int:
        return self.port or DEFAULT_PORTS[self.tls]

    def describe(self) -> str:
        """Where mail goes, for logs (never the password)."""
        user = f"{self.username}@" if self.username else ""
        return f"smtp {user}{self.host}:{self.effective_port} tls={self.tls.value}"


class ProviderSettings(BaseSettings):
    """A Resend-style HTTP email API: ``POST {url}/emails`` with an ``Idempotency-Key`` header
    that the provider remembers for ``key_retention_hours``."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_PROVIDER_", extra="ignore",
                                      populate_by_name=True)

    url: str = Field(default=RESEND_URL,
                     description="Base URL of the provider API (https unless loopback).")
    api_key: SecretStr = Field(description="The provider's API key; never logged.")
    key_retention_hours: float = Field(
        default=RESEND_KEY_RETENTION_HOURS, gt=0,
        description="How long the provider remembers an Idempotency-Key; the retry window "
                    "may not be longer.")
    timeout: float = Field(default=30.0, gt=0, le=900,
                           description="Seconds to wait for the provider's answer.")
    mail_from: str = Field(validation_alias="RUNLEDGER_MAIL_FROM",
                           description="The From address of every message.")

    @field_validator("mail_from")
    @classmethod
    def _valid_sender(cls, value: str) -> str:
        return _sender(value)

    @field_validator("url")
    @classmethod
    def _https_off_loopback(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError(f"must use https unless the host is loopback, got {value!r}")
        return value.rstrip("/")

    @property
    def key_retention_seconds(self) -> float:
        return self.key_retention_hours * 3600

    def describe(self) -> str:
        return f"http provider {self.url}"


def load_settings(kind: type[S], **values: Any) -> S:
    """Settings of ``kind`` from the environment and ``values``; a problem becomes one
    ``MailConfigurationError`` naming each bad variable (a secret's value left out)."""
    try:
        return kind(**values)
    except ValidationError as exc:
        raise MailConfigurationError(
            f"invalid settings: {'; '.join(settings_problems(exc))}") from None
