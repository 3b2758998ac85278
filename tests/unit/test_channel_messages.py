"""Webhook and object-storage messages are validated when they are built, before anything is
queued: an unknown channel, a payload that is not JSON, a bad endpoint name or object key is
refused with an error that names the fix."""

from __future__ import annotations

from typing import Any

import pytest

from store import OutboxMessage, revised_target, split_object_target
from store.errors import InvalidMessage


def test_a_webhook_message_carries_its_endpoint_and_a_copy_of_its_payload() -> None:
    """The target is the endpoint block's name; later changes to the caller's dict do not leak in."""
    payload: dict[str, Any] = {"summary": "ok", "n": [1, 2]}
    message = OutboxMessage.webhook("reports-api", payload)
    payload["n"].append(3)
    assert (message.channel, message.recipient) == ("webhook", "reports-api")
    assert message.payload == {"summary": "ok", "n": [1, 2]}


def test_an_object_message_carries_its_bucket_block_and_key() -> None:
    """The target is 'bucket-block/key'; the payload holds the body and its content type."""
    message = OutboxMessage.object("reports", "daily/2026-12-03.md", "# Report\n", "text/markdown")
    assert message.recipient == "reports/daily/2026-12-03.md"
    assert split_object_target(message.recipient) == ("reports", "daily/2026-12-03.md")
    assert message.payload == {"body": "# Report\n", "content_type": "text/markdown"}


def test_an_email_keeps_its_fields_and_refuses_a_payload() -> None:
    """Email is unchanged; a JSON payload on an email is refused and points to the other kinds."""
    assert OutboxMessage("a@example.com", "Hi", "Body").payload is None
    with pytest.raises(InvalidMessage, match=r"OutboxMessage\.webhook"):
        OutboxMessage("a@example.com", "Hi", "Body", payload={"x": 1})


def test_an_unknown_channel_is_refused() -> None:
    """Only email, webhook and object are channels."""
    with pytest.raises(InvalidMessage, match="channel must be one of email, webhook, object"):
        OutboxMessage("a@example.com", "Hi", "Body", channel="sms")


@pytest.mark.parametrize(("payload", "message"), [
    ({"when": object()}, "is not JSON"),
    ({"ratio": float("nan")}, "is not JSON"),
    (["not", "an", "object"], "must be a JSON object"),
    (None, "must be a JSON object"),
    ({"big": "x" * 300_000}, "above the 262144-byte limit"),
])
def test_a_webhook_payload_that_is_not_a_json_object_is_refused(payload: Any, message: str) -> None:
    """A payload must be a finite JSON object within the size limit."""
    with pytest.raises(InvalidMessage, match=message):
        OutboxMessage.webhook("reports-api", payload)


@pytest.mark.parametrize("endpoint", ["Reports", "https://hooks.example.com/x", "", "a b", "-x"])
def test_a_webhook_target_must_name_an_endpoint_block(endpoint: str) -> None:
    """A URL or anything but a block name is refused: URLs live in the endpoint block."""
    with pytest.raises(InvalidMessage, match="name of a Prefect block"):
        OutboxMessage.webhook(endpoint, {"x": 1})


@pytest.mark.parametrize(("key", "message"), [
    ("/etc/passwd", "must not start with '/'"),
    ("../other/report.md", "'.' or '..' segment"),
    ("daily/../../x.md", "'.' or '..' segment"),
    ("daily/./x.md", "'.' or '..' segment"),
    ("daily//x.md", "must not contain '//'"),
    ("daily/", "end with '/'"),
    ("a\\b.md", "backslashes"),
    ("a\nb.md", "control characters"),
    ("x" * 1025, "longer than 1024 bytes"),
    ("", "non-empty"),
])
def test_an_object_key_that_could_leave_its_folder_is_refused(key: str, message: str) -> None:
    """A leading '/', a '..' segment and other escapes from the bucket's folder are refused."""
    with pytest.raises(InvalidMessage, match=message):
        OutboxMessage.object("reports", key, "{}")


def test_an_object_payload_needs_a_known_content_type() -> None:
    """The report's content type is one the channel knows how to name."""
    with pytest.raises(InvalidMessage, match="content_type must be one of"):
        OutboxMessage.object("reports", "x.bin", "data", "application/octet-stream")


def test_a_webhook_message_takes_no_email_headers_or_body() -> None:
    """Its content is its payload: a body or headers are refused."""
    with pytest.raises(InvalidMessage, match="headers and body must be empty"):
        OutboxMessage("reports-api", "label", "a body", channel="webhook", payload={"x": 1})


@pytest.mark.parametrize(("target", "revised"), [
    ("reports/daily/2026-12-03.md", "reports/daily/2026-12-03.revision-2.md"),
    ("reports/daily/report", "reports/daily/report.revision-2"),
    ("reports/.hidden", "reports/.hidden.revision-2"),
])
def test_a_revision_writes_its_object_beside_the_first(target: str, revised: str) -> None:
    """A revised object key keeps its folder and extension and names the revision."""
    assert revised_target("object", target, 2) == revised
    assert revised_target("webhook", "reports-api", 2) == "reports-api"
