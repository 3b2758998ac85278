"""Fuzzed inputs at the ledger's writes, on SQLite and PostgreSQL: register, register-and-claim,
complete and fail either work or raise an InvalidInput (any other exception fails the test),
and a refusal writes nothing at all."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from store import InvalidInput, Ledger, OutboxMessage, RunIdentity
from tests.support.fuzz import hostile_text, json_like
from tests.support.ledger import register_and_claim, snapshot

FUZZ_DB = settings(max_examples=30, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])
START = datetime(2026, 1, 5, tzinfo=UTC)
documents = json_like | st.dictionaries(hostile_text, json_like, max_size=3)
message_lists = st.lists(
    st.sampled_from([OutboxMessage("a@example.com", "Hi", "Body")]) | st.text(max_size=3)
    | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=1) | st.none(),
    max_size=3)


def identity() -> RunIdentity:
    return RunIdentity("fuzz", f"subject-{uuid.uuid4().hex[:8]}", START, "1")


def refused_without_writing(ledger: Ledger, call: Any) -> bool:
    """Run ``call``; True if it raised InvalidInput (with a message) and the tables did not
    change; False if it worked. Any other exception propagates."""
    before = snapshot(ledger)
    try:
        call()
    except InvalidInput as exc:
        assert str(exc).strip()
        assert snapshot(ledger) == before, f"{type(exc).__name__} after a write: {exc}"
        return True
    return False


@FUZZ_DB
@given(params=documents)
@example(params={"a": "\ud800"})
@example(params={"a": "\0"})
@example(params={"a": float("inf")})
def test_register_with_any_params_works_or_writes_nothing(ledger: Ledger, params: Any) -> None:
    """A Run's params: stored and fingerprinted, or refused with nothing written."""
    run = identity()
    if not refused_without_writing(ledger, lambda: ledger.register(run, params)):
        assert ledger.get(run.run_id).params_fingerprint
    refused_without_writing(
        ledger, lambda: register_and_claim(ledger, identity(), params, owner="w:1", lease=30))


@FUZZ_DB
@given(output=documents, messages=message_lists)
@example(output={"text": "\ud800"}, messages=[])
@example(output={"text": "ok"}, messages=["a@example.com"])
@example(output={"text": "ok"}, messages=[None])
@example(output=[1, 2], messages=[])
def test_complete_with_any_output_and_messages_works_or_writes_nothing(
        ledger: Ledger, output: Any, messages: list[Any]) -> None:
    """The output document and the outbox rows commit together, or neither does and the Run
    is still running under the same fence."""
    run = identity()
    claim = register_and_claim(ledger, run, {}, owner="w:1", lease=30).claim
    assert claim is not None
    if refused_without_writing(ledger, lambda: ledger.complete(claim, output, messages)):
        stored = ledger.get(run.run_id)
        assert (stored.status, stored.fence, stored.output) == ("running", claim.fence, None)
    else:
        assert ledger.get(run.run_id).status == "completed"


@FUZZ_DB
@given(error=hostile_text | st.none() | st.integers())
@example(error="\0")
@example(error="")
def test_fail_with_any_error_text_works_or_writes_nothing(ledger: Ledger, error: Any) -> None:
    """A failure's error text is stored (NUL escaped) or refused with nothing written."""
    claim = register_and_claim(ledger, identity(), {}, owner="w:1", lease=30).claim
    assert claim is not None
    refused_without_writing(ledger, lambda: ledger.fail(claim, error, retryable=False))


def test_a_failure_whose_message_holds_a_lone_surrogate_is_recorded_escaped(
        ledger: Ledger) -> None:
    """Found by fuzzing: ``fail(claim, "\\ud800")`` raised UnicodeEncodeError in the driver,
    so a job exception with such a message could not fail its Run."""
    run = identity()
    claim = register_and_claim(ledger, run, {}, owner="w:1", lease=30).claim
    assert claim is not None
    ledger.fail(claim, "bad \ud800 text", retryable=False)
    assert ledger.get(run.run_id).error == "bad \\ud800 text"
