"""Rendering an outbox message: the same bytes, Message-ID and key on every attempt."""

from __future__ import annotations

import email
from datetime import UTC, datetime
from email import policy

from flows.mail.letter import KEY_HEADER, Letter, message_id_for

KEY = "ab" * 32
QUEUED = datetime(2026, 1, 5, 9, 30, tzinfo=UTC)


def letter(**changes: object) -> Letter:
    values: dict[str, object] = {
        "key": KEY, "sender": "jobs@example.com", "recipient": "ana@example.com",
        "subject": "Weekly digest", "body": "Hello Ana,\nall good.\n", "date": QUEUED,
        "headers": {"X-Job": "digest"},
    }
    values.update(changes)
    return Letter(**values)  # type: ignore[arg-type]


def parse(data: bytes) -> email.message.EmailMessage:
    """The message as a reader sees it (line endings are the transport's business)."""
    return email.message_from_bytes(data.replace(b"\r\n", b"\n"), policy=policy.default)


def test_rendering_twice_gives_identical_bytes() -> None:
    """Nothing in the message depends on when or by whom it is sent."""
    assert letter().to_bytes() == letter().to_bytes()


def test_the_message_id_and_key_headers_derive_from_the_key() -> None:
    """Message-ID is <key@runledger>; X-Idempotency-Key is the key; Date is the queue time."""
    parsed = parse(letter().to_bytes())
    assert parsed["Message-ID"] == message_id_for(KEY) == f"<{KEY}@runledger>"
    assert parsed[KEY_HEADER] == KEY
    assert parsed["Date"].datetime == QUEUED
    assert (parsed["From"], parsed["To"], parsed["X-Job"]) == ("jobs@example.com",
                                                              "ana@example.com", "digest")


def test_lines_end_in_crlf_and_ascii_text_is_7bit() -> None:
    """Wire format: CRLF everywhere; plain ASCII needs no encoding."""
    data = letter().to_bytes()
    assert b"\n" not in data.replace(b"\r\n", b"")
    parsed = parse(data)
    assert parsed["Content-Transfer-Encoding"] == "7bit"
    assert parsed.get_content() == "Hello Ana,\nall good.\n"


def test_non_ascii_subject_headers_and_body_are_encoded_and_round_trip() -> None:
    """Non-ASCII goes out as RFC 2047 words and quoted-printable, and reads back unchanged."""
    subject = "Grüße — résumé of the week, with a subject long enough to need folding on the wire"
    body = "Zoë wrote:\n" + "é" * 300 + "\n"
    data = letter(subject=subject, body=body, headers={"X-Team": "Équipe"}).to_bytes()
    assert data.isascii()
    parsed = parse(data)
    assert parsed["Subject"] == subject and parsed["X-Team"] == "Équipe"
    assert parsed["Content-Transfer-Encoding"] == "quoted-printable"
    assert parsed.get_content() == body


def test_an_ascii_body_with_overlong_lines_is_not_sent_as_7bit() -> None:
    """A line beyond 998 characters would break 7bit: it is quoted-printable instead."""
    parsed = parse(letter(body="x" * 2000 + "\n").to_bytes())
    assert parsed["Content-Transfer-Encoding"] == "quoted-printable"
    assert parsed.get_content() == "x" * 2000 + "\n"


def test_the_provider_payload_is_stable_and_carries_the_same_headers() -> None:
    """The JSON body repeats exactly, with Message-ID and the key among its headers."""
    payload = letter().provider_payload()
    assert payload == letter().provider_payload()
    assert payload["to"] == ["ana@example.com"]
    assert payload["headers"] == {"X-Job": "digest", "Message-ID": message_id_for(KEY),
                                  KEY_HEADER: KEY}
