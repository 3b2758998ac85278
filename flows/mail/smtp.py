"""SMTP transport over aiosmtplib: one connection reused for a pass, TLS required off loopback,
certificates verified, and every failure classified by the phase it happened in."""

from __future__ import annotations

import asyncio
import ssl
from enum import Enum

import aiosmtplib
from aiosmtplib import (
    SMTPAuthenticationError,
    SMTPResponseException,
    SMTPSenderRefused,
)

from flows.mail.errors import MailConfigurationError
from flows.mail.letter import Letter
from flows.mail.settings import SmtpSettings, TlsMode
from flows.mail.transport import EmailTransport
from flows.transport import OutcomeKind, SendOutcome
from store import Reply

SERVICE_CLOSING = 421


class Phase(Enum):
    """How far a send got: what a lost connection means depends on it."""

    CONNECT = "connect"  # connecting, greeting, EHLO, STARTTLS, AUTH
    ENVELOPE = "envelope"  # MAIL FROM, RCPT TO: the receiver has nothing yet
    DATA = "data"  # DATA and the final reply: the receiver may own the message


def _tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind ``exc`` if it is one that retrying will not fix."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and not isinstance(
            seen, ssl.SSLEOFError | ssl.SSLZeroReturnError
        ):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class SmtpTransport(EmailTransport):
    """Sends Letters to one SMTP server, reconnecting after a disconnect or a 421."""

    name = "smtp"
    key_retention_seconds: float | None = None  # nobody promises to dedupe on Message-ID

    def __init__(self, settings: SmtpSettings, *, local_hostname: str = "localhost") -> None:
        self.settings = settings
        self.local_hostname = local_hostname
        self._smtp: aiosmtplib.SMTP | None = None
        self._phase = Phase.CONNECT

    @property
    def sender(self) -> str:
        return self.settings.mail_from

    @property
    def send_reserve_seconds(self) -> float:
        # One send is bounded as a whole (see ``send``): connect and envelope plus the data reply.
        return 3 * self.settings.timeout

    @property
    def where(self) -> str:
        return f"{self.settings.host}:{self.settings.effective_port}"

    async def aclose(self) -> None:
        smtp, self._smtp = self._smtp, None
        if smtp is not None and smtp.is_connected:
            try:
                await smtp.quit(timeout=min(self.settings.timeout, 5.0))
            except (aiosmtplib.SMTPException, OSError):
                smtp.close()

    def _drop(self) -> None:
        smtp, self._smtp = self._smtp, None
        if smtp is not None:
            smtp.close()

    async def send(self, letter: Letter) -> SendOutcome:
        self._phase = Phase.CONNECT
        try:
            async with asyncio.timeout(self.send_reserve_seconds):
                smtp = await self._envelope(letter)
                self._phase = Phase.DATA
                reply = await smtp.data(letter.to_bytes())
            return SendOutcome(OutcomeKind.SENT, Reply(code=reply.code, text=reply.message))
        except MailConfigurationError:
            self._drop()
            raise
        except Exception as exc:  # every other failure is classified, never lost
            return await self._failed(exc, self._phase, letter)

    async def _envelope(self, letter: Letter) -> aiosmtplib.SMTP:
        """MAIL FROM and RCPT TO on a live connection; a reused connection that turns out to be
        closed (idle timeout on the server) is replaced once, as nothing was sent on it."""
        for fresh_only in (False, True):
            self._phase = Phase.CONNECT
            smtp, reused = await self._connection(fresh_only)
            self._phase = Phase.ENVELOPE
            try:
                await smtp.mail(letter.sender)
            except (aiosmtplib.SMTPServerDisconnected, ConnectionError):
                if reused and not fresh_only:
                    self._drop()
                    continue
                raise
            await smtp.rcpt(letter.recipient)
            return smtp
        raise AssertionError("unreachable")

    async def _connection(self, fresh_only: bool) -> tuple[aiosmtplib.SMTP, bool]:
        if self._smtp is not None and self._smtp.is_connected and not fresh_only:
            return self._smtp, True
        self._drop()
        s = self.settings
        smtp = aiosmtplib.SMTP(
            hostname=s.host, port=s.effective_port, use_tls=s.tls is TlsMode.TLS, start_tls=False,
            validate_certs=True, cert_bundle=str(s.ca_file) if s.ca_file else None,
            timeout=s.timeout, local_hostname=self.local_hostname,
        )
        try:
            await smtp.connect()
            await smtp.ehlo()
            if s.tls is TlsMode.STARTTLS:
                if not smtp.supports_extension("starttls"):
                    raise MailConfigurationError(
                        f"{self.where} does not offer STARTTLS, which RUNLEDGER_SMTP_TLS=starttls "
                        "requires; nothing was sent"
                    )
                await smtp.starttls()
                await smtp.ehlo()
            if s.username is not None and s.password is not None:
                if not smtp.supports_extension("auth"):
                    raise MailConfigurationError(
                        f"{self.where} does not offer AUTH after "
                        f"{'TLS' if s.tls is not TlsMode.NONE else 'EHLO'}; cannot log in as "
                        f"{s.username}"
                    )
                await smtp.login(s.username, s.password.get_secret_value())
        except BaseException:
            smtp.close()
            raise
        self._smtp = smtp
        return smtp, False

    async def _reset(self) -> None:
        """End a refused transaction so the connection can carry the next message."""
        if self._smtp is None or not self._smtp.is_connected:
            return
        try:
            await self._smtp.rset()
        except (aiosmtplib.SMTPException, OSError):
            self._drop()

    async def _failed(self, exc: Exception, phase: Phase, letter: Letter) -> SendOutcome:
        tls = _tls_failure(exc)
        if tls is not None:
            self._drop()
            raise MailConfigurationError(
                f"TLS with {self.where} failed ({tls.__class__.__name__}: "
                f"{getattr(tls, 'reason', None) or tls}); check RUNLEDGER_SMTP_TLS, the port and "
                "the server certificate (RUNLEDGER_SMTP_CA_FILE for a private CA)"
            ) from None
        if isinstance(exc, SMTPResponseException):
            return await self._refused(exc, phase, letter)
        self._drop()
        what = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if phase is Phase.DATA:
            return SendOutcome(
                OutcomeKind.AMBIGUOUS,
                error=f"connection to {self.where} lost after the message data was sent "
                      f"(the server may have it): {what}",
            )
        return SendOutcome(
            OutcomeKind.TRANSIENT,
            error=f"could not reach {self.where} ({phase.value}): {what}",
            unreachable=phase is Phase.CONNECT,
        )

    async def _refused(
        self, exc: SMTPResponseException, phase: Phase, letter: Letter
    ) -> SendOutcome:
        code, text = exc.code, exc.message
        reply = Reply(code=code, text=text)
        temporary = 400 <= code < 500
        if phase is Phase.CONNECT:
            self._drop()
            if temporary:
                return SendOutcome(OutcomeKind.TRANSIENT, reply,
                                   error=f"{self.where} is not accepting mail now: {code} {text}",
                                   unreachable=True)
            if isinstance(exc, SMTPAuthenticationError):
                raise MailConfigurationError(
                    f"authentication as {self.settings.username} at {self.where} failed: "
                    f"{code} {text}; check RUNLEDGER_SMTP_USERNAME and RUNLEDGER_SMTP_PASSWORD"
                ) from None
            raise MailConfigurationError(f"{self.where} refused the session: {code} {text}") from None
        if isinstance(exc, SMTPSenderRefused) and not temporary:
            self._drop()
            raise MailConfigurationError(
                f"{self.where} refused the sender {letter.sender}: {code} {text}; "
                "check RUNLEDGER_MAIL_FROM"
            ) from None
        if code == SERVICE_CLOSING:
            self._drop()  # the server is closing this session: reconnect for the next message
        else:
            await self._reset()
        if temporary:
            return SendOutcome(OutcomeKind.TRANSIENT, reply)
        return SendOutcome(OutcomeKind.PERMANENT, reply)

