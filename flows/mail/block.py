"""A Prefect Block for the SMTP server, for Prefect users who keep credentials in blocks; it
produces the same ``SmtpSettings`` as the RUNLEDGER_SMTP_* environment."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from flows.mail.settings import SmtpSettings, TlsMode, load_settings


class SmtpServer(Block):
    """Where the deliver-outbox flow sends mail. TLS (``tls`` or ``starttls``) is required unless
    the host is loopback; certificates are always verified."""

    _block_type_name = "runledger SMTP server"
    _block_type_slug = "runledger-smtp-server"
    _description = "SMTP server, credentials and sender for runledger's outbox delivery."

    host: str = Field(description="SMTP host name or address.")
    port: int | None = Field(default=None, description="Port (default 465 for tls, 587 for starttls, 25 for none).")
    tls: TlsMode = Field(default=TlsMode.STARTTLS, description="tls, starttls or none (loopback only).")
    username: str | None = Field(default=None, description="Login name, if the server needs AUTH.")
    password: SecretStr | None = Field(default=None, description="Password for AUTH.")
    sender: str = Field(description="From address (like RUNLEDGER_MAIL_FROM).")
    timeout: float = Field(default=60.0, description="Seconds to wait for each SMTP reply.")

    def settings(self) -> SmtpSettings:
        """The SMTP settings this block describes (validated like the environment's)."""
        return load_settings(
            SmtpSettings, host=self.host, port=self.port, tls=self.tls, username=self.username,
            password=self.password, mail_from=self.sender, timeout=self.timeout,
        )
