"""Fuzzed identities, subjects, params documents and outbox messages: each either works or
raises an InvalidInput (with a message), never another exception; what works is safe to store
and to put in an email header."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from flows.errors import UnknownSubject
from flows.registry import get_job
from store import InvalidInput, OutboxMessage, RunIdentity, params_fingerprint
from store.channels import MAX_MESSAGE_BYTES
from store.errors import InvalidIdentity, InvalidMessage
from store.identity import canonical_json
from tests.support.fuzz import FUZZ, any_char, hostile_text, json_like, works_or_refused

NOW = datetime(2026, 1, 5, tzinfo=UTC)
addresses = (hostile_text | st.emails() | st.sampled_from([
    "a@example.com", "A@EXAMPLE.COM", "a@b", "a@münchen.de", "ü@example.com", "a@example.com\r\nBcc: x@y.z",
    "\"quoted local\"@example.com", "a@[127.0.0.1]", "a" * 65 + "@example.com", "a@" + "b" * 300 + ".com",
    "Bob <bob@example.com>", "a@example.com\0", "a@-example.com", "a@xn--.com",
]))
header_names = hostile_text | st.sampled_from(["X-Tag", "Bcc", "bcc", "X:Y", "X Y", "Reply-To",
                                               "Message-ID", "x" * 200, "X-\u00e9"])


def _safe_header_text(value: str) -> None:
    """What an accepted header value may not hold: line breaks, controls, NUL, surrogates."""
    assert not any(c in value for c in "\r\n\0\x85\u2028\u2029")
    value.encode("utf-8")  # no lone surrogate


@FUZZ
@given(job=hostile_text, subject=hostile_text, version=hostile_text,
       start=st.datetimes(timezones=st.none() | st.just(UTC)) | st.just("2026-01-05"))
@example(job="digest", subject="\ud800", version="1", start=NOW)
def test_a_run_identity_is_normalized_or_refused(job: str, subject: str, version: str,
                                                 start: Any) -> None:
    """Any job, subject, version and start: an identity whose id is a sha256 of storable
    text, or InvalidIdentity."""
    found = works_or_refused(lambda: RunIdentity(job, subject, start, version))
    if isinstance(found, RunIdentity):
        assert len(found.run_id) == 64
        for field in (found.job, found.subject, found.version):
            assert field == field.strip() and field.encode("utf-8")


@FUZZ
@given(requested=st.none() | st.lists(hostile_text | st.integers() | st.none()
                                      | st.lists(st.text(max_size=2)), max_size=4)
       | st.lists(st.sampled_from(["acme", " acme ", "globex", "initech"]), max_size=3))
@example(requested=[["acme"]])
@example(requested=[None])
def test_requested_subjects_are_known_ones_or_an_unknown_subject(requested: Any) -> None:
    """The flow's ``subjects`` parameter (any JSON list): known subjects, or UnknownSubject
    naming the bad ones and the known ones."""
    job = get_job("competitor-summary")
    found = works_or_refused(lambda: job.resolve_subjects(requested))
    if isinstance(found, list):
        assert set(found) <= set(job.subject_names())
    else:
        assert "known subjects:" in str(found)


@FUZZ
@given(params=json_like | st.dictionaries(hostile_text, json_like, max_size=4))
@example(params={"a": "\ud800"})
@example(params={"a": float("nan")})
@example(params={1: "a", "b": 2})
@example(params={"nul": "a\0b"})
def test_a_params_document_has_a_fingerprint_or_is_refused(params: Any) -> None:
    """Any value as a Run's params: a stable sha256 of canonical, storable JSON, or
    InvalidInput."""
    found = works_or_refused(lambda: params_fingerprint(params))
    if isinstance(found, str):
        assert len(found) == 64 and found == params_fingerprint(params)
        text = canonical_json(params or {})
        assert json.loads(text) == json.loads(text) and "\\u0000" not in text
        text.encode("utf-8")


def test_a_params_document_nested_too_deep_is_refused() -> None:
    """Found by fuzzing (a deep document): RecursionError became InvalidInput."""
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    found = works_or_refused(lambda: params_fingerprint({"deep": deep}))
    assert isinstance(found, InvalidInput) and "nested too deeply" in str(found)


@FUZZ
@given(recipient=addresses, subject=hostile_text, body=hostile_text | st.binary(max_size=4),
       headers=st.dictionaries(header_names, hostile_text | st.integers(), max_size=3)
       | st.lists(st.tuples(st.text(max_size=3), st.text(max_size=3)), max_size=2) | st.none(),
       channel=st.sampled_from(["email", "sms", ""]))
@example(recipient="a@example.com", subject="Hello\ud800", body="x", headers={}, channel="email")
@example(recipient="a@example.com", subject="ok", body="\udfff", headers={}, channel="email")
@example(recipient="a@example.com", subject="ok", body="x", headers={"X-A": "\ud800"},
         channel="email")
@example(recipient="a@example.com", subject="ok", body="x", headers=[("X-A", "1")],
         channel="email")
@example(recipient="a@example.com", subject="ok", body="x", headers=None, channel="email")
@example(recipient="a@example.com", subject="=?utf-8?b?QmNjOiB4QHkuego=?=", body="x",
         headers={}, channel="email")
def test_an_outbox_message_is_valid_or_an_invalid_message(
        recipient: str, subject: str, body: Any, headers: Any, channel: str) -> None:
    """Any recipient, subject, body, headers and channel: a message whose recipient is a
    normalized ASCII address and whose headers cannot inject another header, or
    InvalidMessage."""
    found = works_or_refused(lambda: OutboxMessage(recipient, subject, body, channel, headers))
    if not isinstance(found, OutboxMessage):
        return
    assert found.recipient.isascii() and "@" in found.recipient
    for text in (found.recipient, found.subject, *found.headers, *found.headers.values()):
        _safe_header_text(text)
        assert "=?" not in text
    assert found.size_bytes() <= MAX_MESSAGE_BYTES
    found.body.encode("utf-8")


def test_headers_changed_after_validation_do_not_reach_the_message() -> None:
    """Found while fuzzing: the message kept the caller's dict, so a header added after
    validation (a CRLF injection, or the next message's value in a shared dict) was queued."""
    shared = {"X-Tag": "first"}
    message = OutboxMessage("a@example.com", "Hi", "Body", headers=shared)
    shared["X-Tag"] = "second\r\nBcc: victim@example.com"
    assert message.headers == {"X-Tag": "first"}


@FUZZ
@given(text=st.text(any_char, min_size=1, max_size=20))
def test_a_subject_is_accepted_only_without_line_breaks_controls_or_surrogates(text: str) -> None:
    """A subject is accepted exactly when it is printable, single-line, encodable text."""
    found = works_or_refused(lambda: OutboxMessage("a@example.com", text, "body"))
    if isinstance(found, OutboxMessage):
        _safe_header_text(found.subject)


# --- what the fuzzing found (each was another exception, or a silent write, before) ---------


def test_a_lone_surrogate_is_refused_in_identities_params_and_messages() -> None:
    """Found by fuzzing: "\\ud800" passed validation and then raised UnicodeEncodeError when
    the run id, the fingerprint or the message size was computed."""
    start = datetime(2026, 1, 5, tzinfo=UTC)
    with pytest.raises(InvalidIdentity, match="subject must be valid Unicode text"):
        RunIdentity("digest", "\ud800", start, "1")
    with pytest.raises(InvalidInput, match="params must be valid Unicode text"):
        params_fingerprint({"a": "\ud800"})
    with pytest.raises(InvalidMessage, match="subject must be valid Unicode text"):
        OutboxMessage("a@example.com", "Hi\ud800", "x")
    with pytest.raises(InvalidMessage, match="body must be valid Unicode text"):
        OutboxMessage("a@example.com", "ok", "\udfff")
    with pytest.raises(InvalidMessage, match="header X-A must be valid Unicode text"):
        OutboxMessage("a@example.com", "ok", "x", headers={"X-A": "\ud800"})


def test_a_subject_that_is_not_a_string_is_an_unknown_subject() -> None:
    """Found by fuzzing: ``subjects=[["acme"]]`` raised TypeError (unhashable list); a bare
    string was read as its characters."""
    job = get_job("competitor-summary")
    with pytest.raises(UnknownSubject, match="a subject must be a string, got list"):
        job.resolve_subjects([["acme"]])  # type: ignore[list-item]
    with pytest.raises(UnknownSubject, match="subjects must be a list of subject names, got str"):
        job.resolve_subjects("acme")


def test_headers_that_are_not_a_dict_are_an_invalid_message() -> None:
    """Found by fuzzing: ``headers=None`` raised AttributeError."""
    with pytest.raises(InvalidMessage, match="headers must be a dict of header name to value, "
                                             "got NoneType"):
        OutboxMessage("a@example.com", "ok", "x", headers=None)  # type: ignore[arg-type]
