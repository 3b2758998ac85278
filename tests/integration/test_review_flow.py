"""The review-outbox flow on a real Prefect server: its run pauses with a form listing the
held messages, a filled form sent through the UI's API decides them (approved delivered once,
rejected never), and a form nobody answers ends the run Failed with the messages held."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flows.mail.sink import Sink
from flows.review.flow import review_outbox
from flows.review.form import field_name
from store import Ledger
from tests.support.delivery import cli_env, deliver, queue, statuses
from tests.support.review import (
    final_state,
    form_schema,
    paused_review,
    resume,
    review_run_ids,
    start_review,
    stop,
)

pytestmark = pytest.mark.processes

DAY = timedelta(days=1)


def test_a_paused_review_decides_per_message_and_the_approved_one_is_delivered_once(
        db_url: str, ledger: Ledger, subprocesses_use_the_session_server: None) -> None:
    """The paused run's form has a choice per held message titled with its recipient and
    subject; resumed with approve / reject / keep held, the ledger records the reviewer and
    the reason, and one pass delivers the approved message once."""
    held = queue(ledger, 3, hold=DAY, body="This week's numbers\n")
    known = review_run_ids()
    with Sink() as sink:
        process = start_review(cli_env(db_url, sink), run=held[0].run_id, poll_seconds=1)
        try:
            run = paused_review(known)
            schema = form_schema(run)
            fields = [field_name(m.message_id) for m in held]
            assert set(fields) <= set(schema["properties"])
            assert schema["properties"][fields[0]]["title"] == (
                f"{held[0].recipient}: {held[0].subject}")
            resume(run, {"every_message": "decide per message", "reviewer": "dana",
                         "reason": "checked", fields[0]: "approve", fields[1]: "reject",
                         fields[2]: "keep held"})
            state = final_state(run)
        except AssertionError as exc:
            process.kill()
            raise AssertionError(f"{exc}\nthe review process said:\n{stop(process)}") from None
        output = stop(process)
        assert state.is_completed() and "approved 1, rejected 1, kept held 1" in state.message, \
            output
        deliver(ledger, sink)
        deliver(ledger, sink)
        assert (sink.stats["received"], sink.stats["unique"]) == (1, 1)
    assert statuses(ledger) == {"sent": 1, "rejected": 1, "held": 1}
    decided = [ledger.outbox.message(m.message_id) for m in held[:2]]
    assert [(m.decision, m.decided_by, m.decision_reason) for m in decided if m] == [
        ("approved", "dana", "checked"), ("rejected", "dana", "checked")]


def test_approve_all_in_the_form_approves_every_listed_message(
        db_url: str, ledger: Ledger, subprocesses_use_the_session_server: None) -> None:
    """"approve all" wins over the per-message choices; an empty reviewer is recorded as the
    Prefect UI."""
    held = queue(ledger, 2, hold=DAY)
    known = review_run_ids()
    with Sink() as sink:
        process = start_review(cli_env(db_url, sink), run=held[0].run_id, poll_seconds=1)
        try:
            run = paused_review(known)
            resume(run, {"every_message": "approve all", "reviewer": "", "reason": ""})
            assert final_state(run).is_completed()
        except AssertionError as exc:
            process.kill()
            raise AssertionError(f"{exc}\nthe review process said:\n{stop(process)}") from None
        stop(process)
    assert statuses(ledger) == {"pending": 2}
    assert {ledger.outbox.message(m.message_id).decided_by for m in held} == {  # type: ignore[union-attr]
        "prefect-ui"}


def test_a_review_nobody_answers_ends_unanswered_and_leaves_the_messages_held(
        db_url: str, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, prefect_api: str) -> None:
    """The pause times out: the run ends Failed (the server fails a pause nobody resumed),
    never Completed; nothing was decided."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", db_url)
    held = queue(ledger, 1, hold=DAY)
    state = review_outbox(run=held[0].run_id, timeout_hours=1 / 3600, poll_seconds=1,
                          return_state=True)
    assert state.is_failed()
    assert statuses(ledger) == {"held": 1}


def test_a_review_with_nothing_held_completes_at_once(
        db_url: str, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, prefect_api: str) -> None:
    """No held message: Completed with a message saying so, no pause."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", db_url)
    [sent] = queue(ledger, 1)
    state = review_outbox(run=sent.run_id, return_state=True)
    assert state.is_completed() and "waits for approval" in (state.message or "")
