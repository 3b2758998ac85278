"""A Resend-style HTTP provider transport: ``POST {url}/emails`` with the message's stable key as
``Idempotency-Key`` (the provider answers a repeat with the original result for 24 h), and the
replies classified: 409 payload mismatch is permanent, 409 still-in-flight and 429/5xx transient
(Retry-After honoured), 401/403 a configuration error, other 4xx permanent."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from flows.mail.errors import MailConfigurationError
from flows.mail.letter import Letter
from flows.mail.settings import ProviderSettings
from flows.mail.transport import EmailTransport
from flows.transport import OutcomeKind, SendOutcome, retry_after
from store import Reply

STILL_IN_FLIGHT = "concurrent_idempotent_requests"
MAX_MESSAGE_ID_CHARS = 300  # the ledger's provider_message_id columns
# Failures where the request certainly never reached the provider.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def _text(value: Any, limit: int = 300) -> str:
    """Provider text as the ledger can store it: NUL escaped (PostgreSQL refuses it in text),
    lone surrogates replaced, at most ``limit`` characters."""
    text = str(value)[:limit].replace("\0", "\\0")
    return text.encode("utf-8", "replace").decode("utf-8")


def _message_id(body: Any) -> str | None:
    """The provider's id of the accepted email if it is a usable one: a string or a number,
    1 to 300 printable characters (the ledger's column); anything else is dropped, since the
    send itself succeeded and must still be recorded."""
    found = body.get("id") if isinstance(body, dict) else None
    if isinstance(found, bool) or not isinstance(found, str | int):
        return None
    text = str(found)
    if not 0 < len(text) <= MAX_MESSAGE_ID_CHARS or not text.isprintable() or text != _text(text):
        return None
    return text


def _error(response: httpx.Response) -> tuple[str | None, str]:
    """The provider's error name and message (Resend: ``{"name": ..., "message": ...}``)."""
    try:
        body: Any = response.json()
    except ValueError:
        return None, _text(response.text)
    if not isinstance(body, dict):
        return None, _text(body)
    name = body.get("name")
    return (_text(name, 100) if name else None), _text(body.get("message") or body)


class ProviderTransport(EmailTransport):
    """Sends Letters through an HTTP email API over one pooled client per pass."""

    name = "provider"

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings
        self._client: httpx.AsyncClient | None = None

    @property
    def sender(self) -> str:
        return self.settings.mail_from

    @property
    def key_retention_seconds(self) -> float:
        return self.settings.key_retention_seconds

    @property
    def send_reserve_seconds(self) -> float:
        return 2 * self.settings.timeout

    def _connection(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.settings.url, timeout=self.settings.timeout,
                headers={"Authorization": f"Bearer {self.settings.api_key.get_secret_value()}"},
            )
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def send(self, letter: Letter) -> SendOutcome:
        try:
            async with asyncio.timeout(self.send_reserve_seconds):
                response = await self._connection().post(
                    "/emails", json=letter.provider_payload(),
                    headers={"Idempotency-Key": letter.key},
                )
        except _NOT_SENT as exc:
            return SendOutcome(OutcomeKind.TRANSIENT, unreachable=True,
                               error=f"could not reach {self.settings.url}: {type(exc).__name__}: {exc}")
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            return SendOutcome(
                OutcomeKind.AMBIGUOUS,
                error=f"{self.settings.url} did not answer after the request was sent (it may have "
                      f"accepted it): {type(exc).__name__}: {exc}",
            )
        return self._classify(response)

    def _classify(self, response: httpx.Response) -> SendOutcome:
        status = response.status_code
        if 200 <= status < 300:
            try:
                body: Any = response.json()
            except ValueError:
                body = {}
            return SendOutcome(OutcomeKind.SENT, Reply(code=status, text="accepted",
                                                       provider_message_id=_message_id(body)))
        name, message = _error(response)
        reply = Reply(code=status, text=f"{name}: {message}" if name else message)
        wait = retry_after(response.headers)
        if status in (401, 403):
            raise MailConfigurationError(
                f"{self.settings.url} refused the API key ({status} {reply.text}); check "
                "RUNLEDGER_PROVIDER_API_KEY"
            )
        # Still in flight: try again later; invalid_idempotent_request (another payload): never.
        if status == 409:
            kind = OutcomeKind.TRANSIENT if name == STILL_IN_FLIGHT else OutcomeKind.PERMANENT
            return SendOutcome(kind, reply, retry_after=wait)
        if status == 429 or status >= 500:
            return SendOutcome(OutcomeKind.TRANSIENT, reply, retry_after=wait)
        return SendOutcome(OutcomeKind.PERMANENT, reply)
