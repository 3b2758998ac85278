"""The webhook transport: ``POST`` the message's JSON to its endpoint with ``Idempotency-Key``
(the IETF httpapi draft's semantics) and a Standard Webhooks signature, and classify the reply:
2xx sent; 408/425/429/5xx, 409 (the first request is still in flight) and connection errors
transient, ``Retry-After`` honoured; 401/403 a configuration error; 422 (the key came back with
another payload) and every other 4xx permanent; a timeout or a dropped connection after the
request left is ambiguous. Before resending a message the receiver may have, the endpoint's
status lookup (``GET``: 200 delivered, 404 never seen) settles it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from flows.errors import DeliveryConfigurationError
from flows.transport import OutcomeKind, Parcel, SendOutcome, retry_after
from flows.webhook.settings import WebhookSettings
from store import MessageClaim, Reply

log = logging.getLogger("runledger.delivery.webhook")

Resolver = Callable[[str], Awaitable[WebhookSettings]]
Clock = Callable[[], datetime]
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})
# Failures where the request certainly never reached the receiver.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
REPLY_TEXT_CHARS = 300


def lookup_signed(key: str) -> str:
    """What a status lookup's signature covers: the key it asks about as a JSON string
    (``"3f2a..."``). The GET carries no body; a receiver verifies with
    ``Webhook(secret).verify(json.dumps(key), headers)``, which also binds the signature to
    that key (an empty body would not verify: the library parses what it verified as JSON)."""
    return json.dumps(key)


def _text(response: httpx.Response) -> str:
    text = response.text[:REPLY_TEXT_CHARS].replace("\0", "\\0")
    return text.encode("utf-8", "replace").decode("utf-8") or response.reason_phrase


class WebhookTransport:
    """Sends webhook Parcels over one pooled HTTP client per pass; each message's target names
    its endpoint, resolved once per pass."""

    name = "webhook"
    channel = "webhook"

    def __init__(self, resolve: Resolver, *, max_timeout: float = 30.0,
                 max_window_seconds: float | None = None, clock: Clock | None = None) -> None:
        self._resolve = resolve
        self.max_timeout = max_timeout
        self.max_window_seconds = max_window_seconds
        self._clock = clock or (lambda: datetime.now(UTC))
        self._client: httpx.AsyncClient | None = None
        self._endpoints: dict[str, WebhookSettings] = {}
        self._down: dict[str, str] = {}  # endpoint -> why it could not be reached in this pass

    @property
    def key_retention_seconds(self) -> float | None:
        return None  # per endpoint: checked when each endpoint is resolved

    @property
    def send_reserve_seconds(self) -> float:
        return 2 * self.max_timeout  # a lookup, then the POST

    async def endpoint(self, name: str) -> WebhookSettings:
        """The endpoint called ``name``, checked against this transport's limits."""
        found = self._endpoints.get(name)
        if found is None:
            found = await self._resolve(name)
            if found.timeout > self.max_timeout:
                raise DeliveryConfigurationError(
                    f"webhook endpoint {name!r}: its timeout ({found.timeout:g} s) is above the "
                    f"dispatcher's limit ({self.max_timeout:g} s, RUNLEDGER_DELIVERY_WEBHOOK_MAX_TIMEOUT); "
                    "lower it or raise the limit (and the delivery lease with it)")
            retention = found.key_retention_seconds
            if (retention is not None and self.max_window_seconds is not None
                    and self.max_window_seconds > retention):
                raise DeliveryConfigurationError(
                    f"webhook endpoint {name!r} remembers a key for {retention / 3600:g} h, less "
                    f"than the retry window ({self.max_window_seconds / 3600:g} h, "
                    "RUNLEDGER_DELIVERY_MAX_WINDOW_HOURS): a retry after that could deliver a "
                    "second copy; shorten the window")
            self._endpoints[name] = found
            log.info("resolved %s", found.describe())
        return found

    def _connection(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.max_timeout, follow_redirects=False)
        return self._client

    def render(self, claim: MessageClaim) -> Parcel:
        return Parcel.from_claim(claim)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        self._endpoints.clear()
        self._down.clear()
        if client is not None:
            await client.aclose()

    def _headers(self, endpoint: WebhookSettings, key: str, body: str) -> dict[str, str]:
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        if endpoint.secret is not None:
            # A fresh timestamp per attempt (receivers refuse old ones); the id and the body stay.
            now = self._clock()
            signature = Webhook(endpoint.secret.get_secret_value()).sign(key, now, body)
            headers |= {"webhook-id": key, "webhook-timestamp": str(int(now.timestamp())),
                        "webhook-signature": signature}
        return headers

    async def send(self, parcel: Parcel) -> SendOutcome:
        endpoint = await self.endpoint(parcel.target)
        if parcel.target in self._down:
            return SendOutcome(OutcomeKind.TRANSIENT, error=self._down[parcel.target])
        body = parcel.body().decode("utf-8")
        try:
            async with asyncio.timeout(endpoint.timeout):
                response = await self._connection().post(
                    endpoint.url, content=body.encode("utf-8"),
                    headers=self._headers(endpoint, parcel.key, body), timeout=endpoint.timeout)
        except _NOT_SENT as exc:
            why = f"could not reach webhook {endpoint.name}: {type(exc).__name__}: {exc}"
            self._down[parcel.target] = f"{why} (earlier in this pass; not tried again)"
            return SendOutcome(OutcomeKind.TRANSIENT, error=why)
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            return SendOutcome(
                OutcomeKind.AMBIGUOUS,
                error=f"webhook {endpoint.name} did not answer after the request was sent (it may "
                      f"have accepted it): {type(exc).__name__}: {exc}")
        return self._classify(endpoint, response)

    def _classify(self, endpoint: WebhookSettings, response: httpx.Response) -> SendOutcome:
        status = response.status_code
        reply = Reply(code=status, text=_text(response))
        if 200 <= status < 300:
            return SendOutcome(OutcomeKind.SENT, Reply(code=status, text="accepted"))
        if status in (401, 403):
            raise DeliveryConfigurationError(
                f"webhook {endpoint.name} refused the request ({status} {reply.text}); check its "
                "signing secret or credentials")
        if status in TRANSIENT_STATUSES or status >= 500:
            return SendOutcome(OutcomeKind.TRANSIENT, reply, retry_after=retry_after(response.headers))
        if status == 422:
            return SendOutcome(OutcomeKind.PERMANENT, reply, error=(
                f"422 from webhook {endpoint.name}: it holds this key with another payload "
                f"(Idempotency-Key reused): {reply.text}"))
        return SendOutcome(OutcomeKind.PERMANENT, reply)

    async def settle(self, parcel: Parcel) -> SendOutcome | None:
        """Ask the receiver whether an earlier attempt arrived: SENT if it has the message, None
        if it never saw it (send it) or offers no lookup, any other outcome if it cannot say (do
        not send now)."""
        endpoint = await self.endpoint(parcel.target)
        if endpoint.lookup_url is None:
            return None
        url = endpoint.lookup_for(parcel.key)
        try:
            response = await self._connection().get(
                url, headers=self._headers(endpoint, parcel.key, lookup_signed(parcel.key)),
                timeout=endpoint.timeout)
        except httpx.HTTPError as exc:
            return SendOutcome(OutcomeKind.AMBIGUOUS, error=(
                f"status lookup of webhook {endpoint.name} failed, delivery still unknown: "
                f"{type(exc).__name__}: {exc}"))
        if response.status_code == 200:
            return SendOutcome(OutcomeKind.SENT, Reply(code=200, text="delivered (status lookup)"))
        if response.status_code == 404:
            return None
        if response.status_code in (401, 403):
            raise DeliveryConfigurationError(
                f"webhook {endpoint.name} refused the status lookup ({response.status_code}); "
                "check its signing secret or credentials")
        return SendOutcome(OutcomeKind.AMBIGUOUS, Reply(code=response.status_code, text=_text(response)),
                           error=f"status lookup of webhook {endpoint.name} answered "
                                 f"{response.status_code}, delivery still unknown",
                           retry_after=retry_after(response.headers))
