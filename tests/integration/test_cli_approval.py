"""`runledger outbox held | approve | reject` on both ledgers: the list shows what would go
out, a decision names messages by id, by Run or by a job's period, records who decided, and a
bad one is a clear line with nothing changed."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

from typer.testing import Result

from store import Ledger
from tests.support.delivery import queue, statuses

DAY = timedelta(days=1)


def test_held_lists_each_waiting_message_with_its_text(
        ledger: Ledger, invoke: Callable[..., Result]) -> None:
    """The list names recipient, subject and the start of the text; JSON carries the Run."""
    held = queue(ledger, 2, hold=DAY, body="The summary for this week\n")
    shown = invoke("outbox", "held", env={"COLUMNS": "160"})
    assert shown.exit_code == 0, shown.stderr
    assert "2 message(s) waiting for approval" in shown.stdout
    assert "user0000@example.com" in shown.stdout and "The summary for this week" in shown.stdout
    listed = json.loads(invoke("outbox", "held", "--json").stdout)
    assert [m["message_id"] for m in listed] == [m.message_id for m in held]
    assert {(m["job"], m["status"], m["overdue"]) for m in listed} == {("digest", "held", False)}


def test_approve_by_run_records_the_operator_and_reject_needs_a_reason(
        ledger: Ledger, invoke: Callable[..., Result]) -> None:
    """approve --run decides every held message of that Run; reject without --reason is
    refused by the command line; outbox show and runs show print the decision."""
    held = queue(ledger, 2, hold=DAY)
    [other] = queue(ledger, 1, hold=DAY)
    approved = invoke("outbox", "approve", "--run", held[0].run_id[:10], "--by", "alice",
                      "--reason", "checked the figures")
    assert approved.exit_code == 0, approved.stderr
    assert "approved 2 message(s) by alice" in approved.stdout
    assert statuses(ledger) == {"pending": 2, "held": 1}
    refused = invoke("outbox", "reject", other.message_id)
    assert refused.exit_code == 2 and "--reason" in refused.stderr
    rejected = invoke("outbox", "reject", other.message_id[:8], "--by", "bob", "--reason", "off")
    assert rejected.exit_code == 0, rejected.stderr
    shown = invoke("outbox", "show", other.message_id, env={"COLUMNS": "160"})
    assert "rejected by bob at" in shown.stdout and ": off" in shown.stdout
    run = invoke("runs", "show", held[0].run_id, env={"COLUMNS": "200"})
    assert run.stdout.count("approved by alice") == 2


def test_a_bad_decision_is_one_line_and_changes_nothing(
        ledger: Ledger, invoke: Callable[..., Result]) -> None:
    """An unknown id, a message already approved, two ways of naming at once, a Run without a
    held message: exit 1, one line saying what is wrong, every message as it was."""
    [held] = queue(ledger, 1, hold=DAY)
    [plain] = queue(ledger, 1)
    cases = {
        ("outbox", "approve", held.message_id, "ffff0000"): "no outbox message with an id starting",
        ("outbox", "approve", held.message_id, plain.message_id):
            f"message {plain.message_id} is pending, not held",
        ("outbox", "approve", held.message_id, "--run", held.run_id):
            "name the messages one way",
        ("outbox", "approve", "--run", plain.run_id): "has no held message: nothing to decide",
        ("outbox", "approve", "--job", "digest"): "--job needs --period",
    }
    for args, expected in cases.items():
        result = invoke(*args)
        assert result.exit_code == 1, (args, result.stdout)
        assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            args, result.stderr)
    assert statuses(ledger) == {"held": 1, "pending": 1}
