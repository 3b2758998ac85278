"""Fuzzed provider responses: whatever an HTTP email API answers (any status, body, JSON shape
and Retry-After), the transport classifies it into one SendOutcome (or, for 401/403, a
MailConfigurationError), never another exception, and what it keeps is storable in the ledger."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from flows.mail.errors import MailConfigurationError
from flows.mail.provider import ProviderTransport
from flows.mail.settings import ProviderSettings
from flows.retry_after import retry_after_seconds
from flows.transport import OutcomeKind, SendOutcome
from tests.support.fuzz import FUZZ, hostile_text, json_like

TRANSPORT = ProviderTransport(ProviderSettings(url="http://127.0.0.1:9", api_key="re_x",
                                               mail_from="jobs@example.com"))
MAX_ID_CHARS = 300  # the provider_message_id columns
json_bodies = json_like.map(lambda v: json.dumps(v, default=str).encode()) | st.sampled_from([
    b'{"id": "e-1"}', b'{"id": 12345}', b'{"id": {"nested": true}}', b'{"id": "' + b"x" * 400 + b'"}',
    b'{"id": "a\\u0000b"}', b'{"id": "\\ud800"}', b'{"message": "a\\u0000b", "name": "x"}',
    b'{"message": "\\udfff"}', b'{"name": "concurrent_idempotent_requests"}', b"[1, 2]", b"null",
    b"\xff\xfe not utf-8", b"", b'{"id": null}', b'{"id": ""}', b"1e999",
])
retry_values = hostile_text | st.sampled_from([
    "1e999", "-5", "nan", "inf", "-inf", "0", "120", "Wed, 21 Oct 2015 07:28:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT", "Tue, 99 Foo 2026 99:99:99",
])


def storable(text: str | None) -> None:
    if text is not None:
        assert "\0" not in text
        text.encode("utf-8")


def _headers(retry_after: str | None, content_type: str) -> list[tuple[str, str]]:
    headers = [("content-type", content_type)]
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    return headers


@FUZZ
@given(status=st.integers(100, 599), body=json_bodies | st.binary(max_size=64),
       retry_after=st.none() | retry_values,
       content_type=st.sampled_from(["application/json", "text/plain", "text/html"]))
@example(status=200, body=b'{"id": {"nested": true}}', retry_after=None, content_type="application/json")
@example(status=200, body=b'{"id": "' + b"x" * 400 + b'"}', retry_after=None, content_type="application/json")
@example(status=500, body=b'{"message": "a\\u0000b"}', retry_after=None, content_type="application/json")
@example(status=503, body=b"\x00oops", retry_after="1e999", content_type="text/plain")
@example(status=429, body=b"{}", retry_after="Fri, 31 Dec 9999 23:59:59 GMT", content_type="application/json")
def test_any_provider_response_is_classified_into_a_storable_outcome(
        status: int, body: bytes, retry_after: str | None, content_type: str) -> None:
    """2xx is sent, 401/403 a configuration error, the rest transient or permanent; the
    provider's message id is a short string or None, the reply text has no NUL nor surrogate,
    and the wait hint is finite and not negative."""
    encodable = retry_after is None or (retry_after.isascii() and retry_after.isprintable())
    if not encodable:
        return  # httpx refuses such a header value itself: no server can send it
    response = httpx.Response(status, headers=_headers(retry_after, content_type), content=body)
    try:
        outcome = TRANSPORT._classify(response)
    except MailConfigurationError as exc:
        assert status in (401, 403) and "RUNLEDGER_PROVIDER_API_KEY" in str(exc)
        return
    assert isinstance(outcome, SendOutcome)
    assert (outcome.kind is OutcomeKind.SENT) == (200 <= status < 300)
    message_id: Any = outcome.reply.provider_message_id
    assert message_id is None or (isinstance(message_id, str) and 0 < len(message_id) <= MAX_ID_CHARS)
    storable(message_id)
    storable(outcome.reply.text)
    storable(outcome.summary)
    assert outcome.retry_after is None or (math.isfinite(outcome.retry_after)
                                           and outcome.retry_after >= 0)


@FUZZ
@given(value=st.none() | retry_values)
@example(value="1e999")
@example(value="nan")
def test_a_retry_after_header_is_a_finite_wait_or_none(value: str | None) -> None:
    """Seconds or an HTTP date; anything unreadable, infinite or NaN is no hint at all."""
    seconds = retry_after_seconds(value)
    assert seconds is None or (math.isfinite(seconds) and seconds >= 0)


# --- what the fuzzing found -----------------------------------------------------------------


@pytest.mark.parametrize(("body", "kept"), [
    (b'{"id": {"nested": true}}', None), (b'{"id": 12345}', "12345"),
    (b'{"id": "' + b"x" * 400 + b'"}', None), (b'{"id": "a\\u0000b"}', None),
    (b'{"id": "e-1"}', "e-1"),
])
def test_an_unusable_message_id_of_an_accepted_send_is_dropped_not_stored(
        body: bytes, kept: str | None) -> None:
    """Found by fuzzing: a dict, a 400-character or a NUL id was kept as is, and PostgreSQL
    then refused to mark the (accepted) message sent; now only a short clean string is kept."""
    outcome = TRANSPORT._classify(httpx.Response(200, content=body,
                                                 headers={"content-type": "application/json"}))
    assert outcome.kind is OutcomeKind.SENT and outcome.reply.provider_message_id == kept


def test_a_nul_in_a_provider_error_is_escaped_before_it_reaches_the_ledger() -> None:
    """Found by fuzzing: PostgreSQL refuses NUL in text, so a 500 whose message held one could
    not be recorded as a retry."""
    outcome = TRANSPORT._classify(httpx.Response(
        500, content=b'{"name": "x\\u0000", "message": "a\\u0000b"}',
        headers={"content-type": "application/json"}))
    assert outcome.kind is OutcomeKind.TRANSIENT and outcome.reply.text == "x\\0: a\\0b"


@pytest.mark.parametrize("value", ["1e999", "inf", "nan", "-inf"])
def test_an_infinite_or_nan_retry_after_is_no_hint(value: str) -> None:
    """Found by fuzzing: "1e999" was an infinite wait, which ends every delivery pass at once
    and makes a transient failure dead."""
    assert retry_after_seconds(value) is None
