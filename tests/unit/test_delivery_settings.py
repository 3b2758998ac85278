"""Transport settings: the fixed environment names, TLS required off loopback, secrets kept
out of errors, and a Prefect block that yields the same settings."""

from __future__ import annotations

import pytest

from flows.channels import CHANNELS as DEFINITIONS
from flows.channels import NAMES
from flows.delivery.settings import DeliverySettings
from flows.mail.block import SmtpServer
from flows.mail.errors import MailConfigurationError
from flows.mail.settings import (
    ProviderSettings,
    SmtpSettings,
    TlsMode,
    load_settings,
)
from flows.transport import is_loopback
from store import CHANNELS

SMTP_ENV = {
    "RUNLEDGER_SMTP_HOST": "smtp.example.com", "RUNLEDGER_SMTP_PORT": "2525",
    "RUNLEDGER_SMTP_TLS": "starttls", "RUNLEDGER_SMTP_USERNAME": "mailer",
    "RUNLEDGER_SMTP_PASSWORD": "hunter2-secret", "RUNLEDGER_MAIL_FROM": "Jobs@Example.com",
}


@pytest.fixture
def smtp_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SMTP_ENV.items():
        monkeypatch.setenv(name, value)
    return SMTP_ENV


def test_smtp_settings_come_from_the_runledger_environment(smtp_env: dict[str, str]) -> None:
    """RUNLEDGER_SMTP_HOST/PORT/TLS/USERNAME/PASSWORD and RUNLEDGER_MAIL_FROM are read."""
    settings = load_settings(SmtpSettings)
    assert (settings.host, settings.effective_port, settings.tls) == ("smtp.example.com", 2525,
                                                                       TlsMode.STARTTLS)
    assert settings.username == "mailer"
    assert settings.password is not None and settings.password.get_secret_value() == "hunter2-secret"
    assert settings.mail_from == "Jobs@example.com"  # validated and normalized
    assert "hunter2" not in repr(settings) and "hunter2" not in settings.describe()


@pytest.mark.parametrize(("tls", "port"), [("tls", 465), ("starttls", 587), ("none", 25)])
def test_the_default_port_follows_the_tls_mode(tls: str, port: int) -> None:
    """465 for implicit TLS, 587 for STARTTLS, 25 for none."""
    settings = SmtpSettings(host="127.0.0.1", tls=tls, mail_from="a@example.com")
    assert settings.effective_port == port


def test_plaintext_smtp_off_loopback_is_refused(smtp_env: dict[str, str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """RUNLEDGER_SMTP_TLS=none to a remote host is a configuration error naming the variable."""
    monkeypatch.setenv("RUNLEDGER_SMTP_TLS", "none")
    with pytest.raises(MailConfigurationError, match="RUNLEDGER_SMTP_TLS=none is allowed only") as e:
        load_settings(SmtpSettings)
    assert "hunter2" not in str(e.value)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.0.2", "::1", "[::1]", "localhost",
                                  "mail.localhost"])
def test_loopback_hosts_may_use_plaintext(host: str) -> None:
    """Loopback addresses and localhost names are recognised without DNS."""
    assert is_loopback(host)
    assert SmtpSettings(host=host, tls="none", mail_from="a@example.com").tls is TlsMode.NONE


@pytest.mark.parametrize("host", ["10.0.0.1", "example.com", "localhost.example.com", "0.0.0.0"])
def test_other_hosts_are_not_loopback(host: str) -> None:
    """Private ranges and look-alike names are not loopback."""
    assert not is_loopback(host)


def test_a_bad_password_value_never_appears_in_the_error(smtp_env: dict[str, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation errors list the bad variables, not their (possibly secret) values."""
    monkeypatch.setenv("RUNLEDGER_SMTP_PORT", "not-a-port")
    monkeypatch.delenv("RUNLEDGER_MAIL_FROM")
    with pytest.raises(MailConfigurationError) as e:
        load_settings(SmtpSettings)
    message = str(e.value)
    assert "RUNLEDGER_SMTP_PORT" in message and "RUNLEDGER_MAIL_FROM" in message
    assert "hunter2" not in message


def test_username_without_password_is_refused() -> None:
    """Half a credential is a configuration error."""
    with pytest.raises(MailConfigurationError, match="USERNAME and RUNLEDGER_SMTP_PASSWORD"):
        load_settings(SmtpSettings, host="127.0.0.1", tls="none", mail_from="a@example.com",
                      username="mailer")


def test_an_invalid_sender_is_refused() -> None:
    """RUNLEDGER_MAIL_FROM must be a valid address."""
    with pytest.raises(MailConfigurationError, match="RUNLEDGER_MAIL_FROM"):
        load_settings(SmtpSettings, host="127.0.0.1", tls="none", mail_from="not an address")


def test_the_provider_needs_https_off_loopback() -> None:
    """http:// is allowed only for a loopback provider (tests, local stand-ins)."""
    with pytest.raises(MailConfigurationError, match="must use https"):
        load_settings(ProviderSettings, url="http://api.example.com", api_key="k",
                      mail_from="a@example.com")
    local = load_settings(ProviderSettings, url="http://127.0.0.1:8025/", api_key="k",
                          mail_from="a@example.com")
    assert local.url == "http://127.0.0.1:8025" and local.key_retention_seconds == 24 * 3600


def test_the_block_produces_the_same_settings_as_the_environment(
    smtp_env: dict[str, str],
) -> None:
    """An SmtpServer block with the same values gives equal SmtpSettings."""
    block = SmtpServer(host="smtp.example.com", port=2525, tls=TlsMode.STARTTLS, username="mailer",
                       password="hunter2-secret", sender="Jobs@Example.com")
    assert block.settings() == load_settings(SmtpSettings)


def test_the_block_refuses_plaintext_off_loopback() -> None:
    """The block goes through the same validation as the environment."""
    block = SmtpServer(host="smtp.example.com", tls=TlsMode.NONE, sender="a@example.com")
    with pytest.raises(MailConfigurationError, match="allowed only for a loopback host"):
        block.settings()


def test_delivery_settings_build_the_retry_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """RUNLEDGER_DELIVERY_* set the lease, limits and the uncertain policy."""
    monkeypatch.setenv("RUNLEDGER_DELIVERY_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("RUNLEDGER_DELIVERY_MAX_WINDOW_HOURS", "2")
    monkeypatch.setenv("RUNLEDGER_DELIVERY_UNCERTAIN", "hold")
    policy = load_settings(DeliverySettings).policy()
    assert (policy.max_attempts, policy.max_window, policy.uncertain.value) == (5, 7200, "hold")


def test_every_channel_the_ledger_accepts_has_one_definition_in_flows() -> None:
    """flows/channels.py lists one definition per channel name of store's rules, in their order."""
    assert NAMES == CHANNELS
    assert len({d.settings for d in DEFINITIONS}) == len(DEFINITIONS)
