"""Short ids on both dialects: a Run or an outbox message is found by any unique prefix of its
id, as git finds a commit; an ambiguous, unknown, short or non-hex prefix is a clear error."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import UTC, datetime

import pytest

from store import InvalidInput, Ledger, OutboxMessage, RunIdentity
from store.errors import AmbiguousId, MessageNotFound, RunNotFound
from store.identity import message_key

PERIOD = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)


def identity(subject: str) -> RunIdentity:
    return RunIdentity("digest", subject, PERIOD, "v1")


def subjects_sharing_a_prefix(count: int, chars: int = 4) -> list[str]:
    """``count`` subjects whose Run ids share their first ``chars`` characters."""
    by_prefix: dict[str, list[str]] = defaultdict(list)
    for n in itertools.count():
        subject = f"team-{n}"
        found = by_prefix[identity(subject).run_id[:chars]]
        found.append(subject)
        if len(found) == count:
            return found
    raise AssertionError("unreachable")


def test_a_unique_prefix_finds_the_run_whatever_its_case(ledger: Ledger) -> None:
    """Four or more leading characters of a Run id, in either case, name that Run."""
    run_id = ledger.register(identity("team-a")).run_id
    ledger.register(identity("team-b"))
    assert ledger.resolve_run_id(run_id[:4]) == run_id
    assert ledger.resolve_run_id(f" {run_id[:12].upper()} ") == run_id
    assert ledger.resolve_run_id(run_id) == run_id


def test_an_ambiguous_prefix_names_how_many_runs_start_with_it(ledger: Ledger) -> None:
    """A prefix shared by three Runs is refused with the count, the candidates and what to do."""
    subjects = subjects_sharing_a_prefix(3)
    ids = sorted(ledger.register(identity(s)).run_id for s in subjects)
    with pytest.raises(AmbiguousId) as refused:
        ledger.resolve_run_id(ids[0][:4])
    message = str(refused.value)
    assert f"run id {ids[0][:4]!r} is ambiguous: 3 runs start with it" in message
    assert all(run_id[:16] in message for run_id in ids)
    assert "give more of its characters" in message
    assert ledger.resolve_run_id(ids[1][:20]) == ids[1]


def test_a_prefix_no_run_has_is_run_not_found(ledger: Ledger) -> None:
    """No match is RunNotFound, naming the prefix, or the id when it is whole."""
    ledger.register(identity("team-a"))
    absent = next(p for p in ("0000", "ffff", "abcd") if not
                  identity("team-a").run_id.startswith(p))
    with pytest.raises(RunNotFound, match=f"no run with an id starting '{absent}'"):
        ledger.resolve_run_id(absent)
    with pytest.raises(RunNotFound, match=r"no run with id '0{64}'"):
        ledger.resolve_run_id("0" * 64)


@pytest.mark.parametrize(("given", "problem"), [
    ("abc", "too short: give at least 4 of its characters"),
    ("", "is not an id"),
    ("d4baf76g", "is not an id"),
    ("a" * 65, "is not an id"),
    ("d4ba%", "is not an id"),
])
def test_a_short_or_non_hex_prefix_is_refused(ledger: Ledger, given: str, problem: str) -> None:
    """Fewer than four characters, or anything but hex digits, is invalid input."""
    with pytest.raises(InvalidInput, match=problem):
        ledger.resolve_run_id(given)


def test_a_message_is_found_by_a_unique_prefix_of_its_id(ledger: Ledger) -> None:
    """Outbox message ids resolve the same way: unique prefix, ambiguity and no match."""
    run = ledger.register(identity("team-a"))
    by_prefix: dict[str, list[str]] = defaultdict(list)
    for n in itertools.count():
        recipient = f"r{n}@example.com"
        found = by_prefix[message_key(run.run_id, "email", recipient)[:4]]
        found.append(recipient)
        if len(found) == 2:
            break
    claim = ledger.claim(run.run_id, "worker-1:101", 60)
    assert claim is not None
    ledger.complete(claim, {"summary": "ok"}, [OutboxMessage(r, "Digest", "b") for r in found])
    ids = sorted(m.message_id for m in ledger.outbox.messages(run_id=run.run_id))
    with pytest.raises(AmbiguousId, match="2 outbox messages start with it"):
        ledger.outbox.resolve_message_id(ids[0][:4])
    assert ledger.outbox.resolve_message_id(ids[1][:12]) == ids[1]
    with pytest.raises(MessageNotFound, match="no outbox message with id"):
        ledger.outbox.resolve_message_id("0" * 64)
