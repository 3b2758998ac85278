"""Run identity: a stable run key from the normalized identity, and clear errors for bad fields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from hashlib import sha256

import pytest

from store import InvalidInput, RunIdentity, params_fingerprint
from store.errors import InvalidIdentity
from store.identity import message_key, run_key

START = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)


def test_run_key_is_the_sha256_of_the_normalized_identity() -> None:
    """The key is sha256 over stripped fields and the UTC period start in ISO seconds."""
    expected = sha256(b"digest|team-a|2026-11-29T23:00:00+00:00|v1").hexdigest()
    assert run_key("digest", "team-a", START, "v1") == expected


def test_run_key_is_the_same_for_the_same_instant_in_any_offset() -> None:
    """Berlin midnight and 23:00 UTC the day before are one period start, so one Run."""
    berlin = START.astimezone(timezone(timedelta(hours=1)))
    assert run_key("digest", "team-a", berlin, "v1") == run_key("digest", "team-a", START, "v1")


def test_run_key_ignores_surrounding_whitespace_and_sub_second_parts() -> None:
    """Stripped fields and ISO seconds make cosmetic variants the same Run."""
    assert run_key(" digest ", "team-a\t", START.replace(microsecond=999), " v1") == run_key(
        "digest", "team-a", START, "v1"
    )


def test_run_key_changes_with_each_identity_field() -> None:
    """Job, subject, period start and version each make a different Run."""
    base = run_key("digest", "team-a", START, "v1")
    variants = [
        run_key("digest2", "team-a", START, "v1"),
        run_key("digest", "team-b", START, "v1"),
        run_key("digest", "team-a", START + timedelta(days=1), "v1"),
        run_key("digest", "team-a", START, "v2"),
    ]
    assert base not in variants
    assert len(set(variants)) == len(variants)


def test_run_identity_normalizes_on_creation_and_agrees_with_run_key() -> None:
    """A RunIdentity stores the normalized fields and its run_id is run_key of them."""
    identity = RunIdentity(" digest ", "team-a", START.astimezone(timezone(timedelta(hours=5))), "v1")
    assert (identity.job, identity.period_start.tzinfo) == ("digest", UTC)
    assert identity.run_id == run_key("digest", "team-a", START, "v1")


def test_naive_period_start_is_refused_naming_the_field() -> None:
    """A naive datetime has no instant: the error names period_start."""
    with pytest.raises(InvalidIdentity, match="period_start must be timezone-aware"):
        RunIdentity("digest", "team-a", datetime(2026, 11, 29), "v1")
    with pytest.raises(ValueError, match="period_start"):
        run_key("digest", "team-a", datetime(2026, 11, 29), "v1")


@pytest.mark.parametrize("field", ["job", "subject", "version"])
def test_empty_identity_field_is_refused_naming_it(field: str) -> None:
    """An empty or blank field is an error that names the field."""
    values = {"job": "digest", "subject": "team-a", "version": "v1", field: "   "}
    with pytest.raises(InvalidIdentity, match=f"{field} must not be empty"):
        RunIdentity(values["job"], values["subject"], START, values["version"])


@pytest.mark.parametrize("bad", ["team|a", "team\na", "team\ra", "team\0a"])
def test_separator_or_line_break_inside_a_field_is_refused(bad: str) -> None:
    """A separator inside a field could make two identities collide, so it is refused."""
    with pytest.raises(InvalidIdentity, match="subject must not contain"):
        RunIdentity("digest", bad, START, "v1")


def test_overlong_identity_field_is_refused() -> None:
    """A field longer than its column is refused before any database sees it."""
    with pytest.raises(InvalidIdentity, match="subject is longer than 500"):
        RunIdentity("digest", "x" * 501, START, "v1")


def test_params_fingerprint_ignores_key_order_and_none_equals_empty() -> None:
    """Equal parameters give the same fingerprint whatever their order."""
    assert params_fingerprint({"a": 1, "b": [1, 2]}) == params_fingerprint({"b": [1, 2], "a": 1})
    assert params_fingerprint(None) == params_fingerprint({})
    assert params_fingerprint({"a": 1}) != params_fingerprint({"a": 2})


def test_params_that_are_not_json_are_refused() -> None:
    """Parameters must serialize to JSON (and hold no NUL) to be fingerprinted and stored."""
    with pytest.raises(InvalidInput, match="JSON-serializable"):
        params_fingerprint({"when": datetime.now(UTC)})
    with pytest.raises(InvalidInput, match="NUL"):
        params_fingerprint({"prompt": "a\0b"})


def test_message_key_is_stable_per_run_channel_and_recipient() -> None:
    """Every delivery attempt derives the same key; another recipient gets another key."""
    run_id = run_key("digest", "team-a", START, "v1")
    assert message_key(run_id, "email", "a@example.com") == message_key(run_id, "email", "a@example.com")
    assert message_key(run_id, "email", "a@example.com") != message_key(run_id, "email", "b@example.com")
