"""What an Approval holds, what a held message must say, and what a filled review form decides
(no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flows.errors import InvalidJob
from flows.jobs import Approval, OutboxMessage
from flows.review.form import UI_REVIEWER, decided, field_name, review_form
from flows.review.select import Selection
from store import HeldMessage, InvalidInput, QueuedMessage

DAY = timedelta(days=1)


def held(i: int) -> HeldMessage:
    message = QueuedMessage(message_id=str(i) * 64, run_id="r" * 64, channel="email",
                            recipient=f"user{i}@example.com", subject=f"Digest {i}",
                            body="text", status="held")
    return HeldMessage(message, "digest", "acme", datetime(2026, 1, 5, tzinfo=UTC), 0)


def test_an_approval_holds_only_its_channels_with_its_deadline_or_the_default() -> None:
    """Email held for the job's deadline; a webhook of a job holding only email goes out."""
    email = OutboxMessage("a@example.com", "s", "b")
    hook = OutboxMessage.webhook("reports-api", {"x": 1})
    made = Approval(channels=("email",)).hold([email, hook], DAY)
    assert [m.hold for m in made] == [DAY, None]
    assert Approval(deadline=timedelta(hours=2)).hold([email], DAY)[0].hold == timedelta(hours=2)


@pytest.mark.parametrize("fields, named", [
    ({"channels": ("fax",)}, "approval channels"), ({"channels": "email"}, "approval channels"),
    ({"deadline": timedelta(0)}, "approval deadline"), ({"on_deadline": "ignore"}, "on_deadline"),
])
def test_a_bad_approval_is_refused_naming_its_field(fields: dict[str, object], named: str) -> None:
    """Unknown channel, a bare string, a zero deadline, an unknown deadline policy."""
    with pytest.raises(InvalidJob, match=named):
        Approval(**fields)  # type: ignore[arg-type]


def test_a_hold_must_be_a_positive_timedelta() -> None:
    """hold=0 or a number of seconds is refused with the fix."""
    for bad in (timedelta(0), 3600):
        with pytest.raises(InvalidInput, match="hold must be a positive timedelta"):
            OutboxMessage("a@example.com", "s", "b", hold=bad)  # type: ignore[arg-type]


def test_the_form_has_a_titled_choice_per_message_and_per_message_answers_decide() -> None:
    """One field per message titled recipient: subject; approve, reject and keep held apply;
    the reviewer and reason are kept."""
    messages = [held(1), held(2), held(3)]
    form = review_form(messages, Selection(job="digest", period="2026-01-05"))
    schema = form.model_json_schema()
    assert schema["properties"][field_name(messages[0].message.message_id)]["title"] == (
        "user1@example.com: Digest 1")
    answer = form(every_message="decide per message", reviewer=" dana ", reason="ok", **{
        field_name(messages[0].message.message_id): "approve",
        field_name(messages[1].message.message_id): "reject"})
    result = decided(answer, messages)
    ids = [m.message.message_id for m in messages]
    assert (result.approve, result.reject, result.kept) == ([ids[0]], [ids[1]], [ids[2]])
    assert (result.by, result.reason) == ("dana", "ok")


def test_reject_all_wins_over_the_per_message_choices_and_an_empty_name_is_the_ui() -> None:
    """"reject all" rejects every listed message; no name recorded as the Prefect UI."""
    messages = [held(1), held(2)]
    form = review_form(messages, Selection())
    result = decided(form(every_message="reject all", **{
        field_name(messages[0].message.message_id): "approve"}), messages)
    assert result.reject == [m.message.message_id for m in messages] and result.approve == []
    assert (result.by, result.reason) == (UI_REVIEWER, None)
