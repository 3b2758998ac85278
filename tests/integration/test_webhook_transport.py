"""The webhook transport against a real receiver on loopback: signed POSTs with the stable key,
every reply classified, and an uncertain delivery settled by the receiver's status lookup."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import SecretStr

from flows.errors import DeliveryConfigurationError
from flows.transport import OutcomeKind, Parcel, SendOutcome
from flows.webhook.block import endpoint_settings
from flows.webhook.settings import WebhookSettings
from flows.webhook.transport import WebhookTransport
from tests.support.webhook_receiver import PATH, SECRET, Fault, WebhookReceiver

KEY = "a" * 64
PAYLOAD = {"run": "r1", "summary": "Prices rose 3 %", "items": [1, 2, 3]}


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as found:
        yield found


def parcel(key: str = KEY, payload: dict[str, Any] | None = None) -> Parcel:
    return Parcel(key=key, channel="webhook", target="reports", payload=payload or PAYLOAD,
                  created_at=datetime(2026, 12, 3, tzinfo=UTC))


def transport(receiver: WebhookReceiver, **overrides: Any) -> WebhookTransport:
    values: dict[str, Any] = {"name": "reports", "url": receiver.url, "secret": SecretStr(SECRET),
                              "lookup_url": "{url}/{key}", "timeout": 2.0} | overrides
    settings = endpoint_settings(**values)

    async def resolve(name: str) -> WebhookSettings:
        if name != "reports":
            raise DeliveryConfigurationError(f"no webhook endpoint block named {name!r}")
        return settings

    return WebhookTransport(resolve, max_timeout=5.0)


def send(t: WebhookTransport, p: Parcel | None = None) -> SendOutcome:
    async def go() -> SendOutcome:
        try:
            return await t.send(p or parcel())
        finally:
            await t.aclose()
    return asyncio.run(go())


def settle(t: WebhookTransport, p: Parcel | None = None) -> SendOutcome | None:
    async def go() -> SendOutcome | None:
        try:
            return await t.settle(p or parcel())
        finally:
            await t.aclose()
    return asyncio.run(go())


def test_a_signed_post_with_the_stable_key_is_sent(receiver: WebhookReceiver) -> None:
    """The receiver verifies the Standard Webhooks signature and gets the payload once, keyed."""
    outcome = send(transport(receiver))
    assert outcome.kind is OutcomeKind.SENT
    assert receiver.processed == {KEY: 1}
    assert receiver.payloads[KEY] == PAYLOAD
    assert receiver.bad_signatures == 0


def test_a_wrong_secret_is_a_configuration_error(receiver: WebhookReceiver) -> None:
    """401 from a receiver that cannot verify the signature stops delivery as misconfigured."""
    other = "whsec_" + "b3RoZXItc2VjcmV0LW9mLXRoZS10ZXN0cw=="
    with pytest.raises(DeliveryConfigurationError, match="signing secret"):
        send(transport(receiver, secret=SecretStr(other)))
    assert receiver.bad_signatures == 1
    assert not receiver.processed


def test_a_repeat_with_the_same_key_is_not_processed_again(receiver: WebhookReceiver) -> None:
    """Every attempt sends the same body under the same key: an honouring receiver processes it once."""
    t = transport(receiver)
    assert send(t).kind is OutcomeKind.SENT
    assert send(t).kind is OutcomeKind.SENT
    assert receiver.posts[KEY] == 2
    assert receiver.processed[KEY] == 1


@pytest.mark.parametrize(("status", "kind"), [
    (408, OutcomeKind.TRANSIENT), (409, OutcomeKind.TRANSIENT), (425, OutcomeKind.TRANSIENT),
    (429, OutcomeKind.TRANSIENT), (500, OutcomeKind.TRANSIENT), (503, OutcomeKind.TRANSIENT),
    (422, OutcomeKind.PERMANENT), (400, OutcomeKind.PERMANENT), (404, OutcomeKind.PERMANENT),
    (410, OutcomeKind.PERMANENT),
])
def test_each_reply_is_classified(receiver: WebhookReceiver, status: int, kind: OutcomeKind) -> None:
    """408/409/425/429/5xx are transient, 422 and the other 4xx permanent."""
    receiver.script.append(Fault(status=status))
    outcome = send(transport(receiver))
    assert outcome.kind is kind
    assert outcome.reply.code == status


def test_retry_after_is_honoured(receiver: WebhookReceiver) -> None:
    """A 429's Retry-After comes back as the outcome's wait."""
    receiver.script.append(Fault(status=429, retry_after="7"))
    outcome = send(transport(receiver))
    assert (outcome.kind, outcome.retry_after) == (OutcomeKind.TRANSIENT, 7.0)


def test_a_changed_payload_under_the_same_key_is_permanent_and_says_why(
        receiver: WebhookReceiver) -> None:
    """The receiver's 422 for a reused key with another body is dead, not retried."""
    t = transport(receiver)
    assert send(t).kind is OutcomeKind.SENT
    outcome = send(t, parcel(payload={"changed": True}))
    assert outcome.kind is OutcomeKind.PERMANENT
    assert "another payload" in outcome.summary


def test_a_connection_dropped_after_processing_is_ambiguous(receiver: WebhookReceiver) -> None:
    """The receiver processed it and closed without a reply: the sender cannot know."""
    receiver.script.append(Fault(drop=True))
    outcome = send(transport(receiver))
    assert outcome.kind is OutcomeKind.AMBIGUOUS
    assert receiver.processed[KEY] == 1


def test_a_timeout_after_the_request_left_is_ambiguous(receiver: WebhookReceiver) -> None:
    """A reply slower than the endpoint's timeout: the request left, the message may be there."""
    receiver.script.append(Fault(delay=1.5))
    outcome = send(transport(receiver, timeout=0.5))
    assert outcome.kind is OutcomeKind.AMBIGUOUS
    assert "may have accepted" in outcome.summary


def test_a_receiver_that_is_down_is_transient() -> None:
    """Connection refused: the request never left, so a retry is safe."""
    with WebhookReceiver() as gone:
        t = transport(gone)
    outcome = send(t)
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert "could not reach" in outcome.summary


def test_the_lookup_says_delivered_after_a_dropped_connection(receiver: WebhookReceiver) -> None:
    """An uncertain delivery the receiver has is settled as sent, with no second POST."""
    receiver.script.append(Fault(drop=True))
    t = transport(receiver)
    assert send(t).kind is OutcomeKind.AMBIGUOUS
    settled = settle(t)
    assert settled is not None and settled.kind is OutcomeKind.SENT
    assert receiver.posts[KEY] == 1
    assert receiver.lookups[KEY] == 1


def test_the_lookup_says_never_seen_when_the_receiver_lacks_it(receiver: WebhookReceiver) -> None:
    """404 from the lookup: nothing arrived, so the message is to be sent (None)."""
    assert settle(transport(receiver)) is None
    assert receiver.lookups[KEY] == 1


def test_a_status_lookup_verifies_with_standardwebhooks_as_documented(
        receiver: WebhookReceiver) -> None:
    """The receiver runs ``Webhook(secret).verify(json.dumps(key), headers)`` on the GET, as
    docs/how-to/outbox.md says: it verifies (no bad signature), and the lookup answers."""
    assert settle(transport(receiver)) is None
    assert (receiver.lookups[KEY], receiver.bad_signatures) == (1, 0)


def test_a_status_lookup_signed_with_another_secret_is_refused_by_the_receiver(
        receiver: WebhookReceiver) -> None:
    """A wrong signing secret: the receiver's verify fails, it answers 401, and the lookup is a
    configuration error naming the secret, never a delivery outcome."""
    wrong = transport(receiver, secret=SecretStr("whsec_" + "d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldA=="))
    with pytest.raises(DeliveryConfigurationError, match="refused the status lookup"):
        settle(wrong)
    assert (receiver.lookups[KEY], receiver.bad_signatures) == (0, 1)


def test_an_endpoint_without_a_lookup_is_never_asked() -> None:
    """No lookup configured: settling gives None (today's behaviour), no GET is sent."""
    with WebhookReceiver(lookup=False) as receiver:
        assert settle(transport(receiver, lookup_url=None)) is None
        assert not receiver.lookups


def test_a_lookup_that_cannot_answer_leaves_it_uncertain() -> None:
    """A lookup answering neither 200 nor 404 says nothing: ambiguous, no resend now."""
    with WebhookReceiver(lookup=False) as receiver:  # answers 405 to GET
        settled = settle(transport(receiver))
    assert settled is not None and settled.kind is OutcomeKind.AMBIGUOUS


def test_the_secret_is_never_logged(receiver: WebhookReceiver,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """Resolving, sending and failing log the endpoint's host, never its secret."""
    caplog.set_level(logging.DEBUG)
    receiver.script.append(Fault(status=500))
    send(transport(receiver))
    raw = SECRET.removeprefix("whsec_")
    assert "reports" in caplog.text
    assert raw not in caplog.text and SECRET not in caplog.text


@pytest.mark.parametrize(("values", "message"), [
    ({"url": "http://hooks.example.com/x"}, "must use https unless the host is loopback"),
    ({"url": "ftp://127.0.0.1/x"}, "must be an http(s) URL"),
    ({"lookup_url": "{url}/status"}, "must contain {key}"),
    ({"lookup_url": "http://status.example.com/{key}"}, "must use https"),
    ({"secret": SecretStr("whsec_")}, "whsec_ followed by base64"),
])
def test_bad_endpoint_settings_are_refused_with_the_fix(values: dict[str, Any], message: str) -> None:
    """A plain-http URL off loopback, a lookup without the key or an empty secret is refused."""
    base: dict[str, Any] = {"name": "reports", "url": "https://hooks.example.com" + PATH}
    with pytest.raises(DeliveryConfigurationError, match="reports") as raised:
        endpoint_settings(**(base | values))
    assert message in str(raised.value)
    assert "whsec_c2Vj" not in str(raised.value)


def test_an_unknown_endpoint_is_a_configuration_error(receiver: WebhookReceiver) -> None:
    """A target that names no endpoint block stops delivery with the name in the error."""
    with pytest.raises(DeliveryConfigurationError, match="'missing'"):
        asyncio.run(transport(receiver).send(
            Parcel(KEY, "webhook", "missing", PAYLOAD, datetime(2026, 12, 3, tzinfo=UTC))))
