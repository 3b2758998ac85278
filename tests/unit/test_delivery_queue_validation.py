"""Bad outbox messages are refused when queued, with an error that names what is wrong."""

from __future__ import annotations

import pytest

from store import OutboxMessage
from store.errors import InvalidMessage

GOOD = {"recipient": "ana@example.com", "subject": "Weekly digest", "body": "Hello\n"}


def message(**changes: object) -> OutboxMessage:
    return OutboxMessage(**{**GOOD, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "subject",
    [
        "Digest\r\nBcc: victim@example.com",
        "Digest\nX-Injected: 1",
        "Digest\r",
        "Digest\x00",
        "Digest\x0bX-Injected: 1",  # str.splitlines() breaks here too
        "Digest\x1cX",
        "Digest\x85X",
        "Digest\u2028Bcc: victim@example.com",
        "=?utf-8?q?Digest=0D=0ABcc:_victim@example.com?=",  # CVE-2024-6923 on 3.11.7
        "=?UTF-8?B?RGlnZXN0DQpCY2M6IHZpY3RpbUBleGFtcGxlLmNvbQ==?=",
        "Digest =?iso-8859-1?q?=0A?= tail",
    ],
)
def test_header_injection_in_the_subject_is_refused(subject: str) -> None:
    """Raw or RFC 2047-encoded line breaks and control characters in a subject are refused."""
    with pytest.raises(InvalidMessage, match="subject must not contain"):
        message(subject=subject)


@pytest.mark.parametrize("value", ["a\r\nBcc: x@example.com", "=?utf-8?q?a=0Ab?=", "a\tb\x07"])
def test_header_injection_in_a_custom_header_is_refused(value: str) -> None:
    """Custom header values get the same checks as the subject."""
    with pytest.raises(InvalidMessage, match="header X-Tag must not contain"):
        message(headers={"X-Tag": value})


@pytest.mark.parametrize("name", ["Bcc", "message-id", "X-Idempotency-Key", "From"])
def test_headers_owned_by_the_dispatcher_cannot_be_set(name: str) -> None:
    """A job cannot override addressing, the Message-ID or the key."""
    with pytest.raises(InvalidMessage, match="set by the dispatcher"):
        message(headers={name: "x"})


@pytest.mark.parametrize("name", ["X Tag", "X-Tag:", "Tëst", ""])
def test_invalid_header_names_are_refused(name: str) -> None:
    """Header names must be printable ASCII without spaces or colons."""
    with pytest.raises(InvalidMessage, match="not a valid RFC 5322 field name"):
        message(headers={name: "x"})


@pytest.mark.parametrize(
    "recipient",
    ["not-an-address", "ana@", "@example.com", "ana@example", "ana@exa mple.com",
     "ana@example.com\r\nBcc: x@example.com", "Ana <ana@example.com>", "ana@example.com,bob@example.com",
     "üser@example.com", ""],
)
def test_invalid_recipients_are_refused(recipient: str) -> None:
    """Only one syntactically valid ASCII address is accepted as a recipient."""
    with pytest.raises(InvalidMessage, match="recipient"):
        message(recipient=recipient)


def test_recipients_are_normalized() -> None:
    """The domain is lower-cased and an internationalized domain becomes its IDNA form."""
    assert message(recipient=" Ana@Example.COM ").recipient == "Ana@example.com"
    assert message(recipient="ana@bücher.de").recipient == "ana@xn--bcher-kva.de"


def test_an_oversized_message_is_refused() -> None:
    """The body counts toward the message size limit."""
    with pytest.raises(InvalidMessage, match="byte limit"):
        message(body="x" * 300_000)


def test_a_harmless_message_with_unicode_and_tabs_is_accepted() -> None:
    """Non-ASCII text, tabs in headers and multi-line bodies are fine."""
    ok = message(subject="Grüße\tand résumé", body="line 1\nline 2\n", headers={"X-Team": "Équipe"})
    assert ok.subject == "Grüße\tand résumé"
