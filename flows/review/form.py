"""The review form a paused review-outbox flow run shows in the Prefect UI: one choice for
every message at once, one per message (keep held, approve, reject), the reviewer's name and
the reason; and what a filled form decides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import pydantic
from prefect.input import RunInput

from flows.review.select import Selection
from store import HeldMessage

Each = Literal["keep held", "approve", "reject"]
Every = Literal["decide per message", "approve all", "reject all"]
UI_REVIEWER = "prefect-ui"  # recorded when the form's reviewer field is left empty
UI_REASON = "rejected in the Prefect UI without a reason"
FIELD_PREFIX = "message_"
TEXT_CHARS = 2000  # of a message's text shown in the description and the artifact
FIELD_TEXT_CHARS = 400  # of a message's text shown under its choice in the form


class ReviewForm(RunInput):
    """A person's decision on the held messages listed above."""

    every_message: Every = pydantic.Field(
        default="decide per message", title="All messages",
        description="Approve or reject every listed message at once, or decide per message "
                    "below.")
    reviewer: str = pydantic.Field(default="", title="Your name",
                                   description="Recorded with the decision.")
    reason: str = pydantic.Field(default="", title="Reason",
                                 description="Why (recorded with the decision).")


def field_name(message_id: str) -> str:
    return FIELD_PREFIX + message_id[:16]


def _text(h: HeldMessage, limit: int = TEXT_CHARS) -> str:
    payload = h.message.payload or {}
    text = h.message.body or str(payload.get("text") or payload.get("body") or payload)
    return text if len(text) <= limit else text[:limit] + "..."


def description(held: list[HeldMessage], chosen: Selection) -> str:
    """The Markdown shown above the form: every held message with its recipient, subject and
    text, and the CLI commands that decide the same."""
    lines = [f"### {len(held)} held message(s) to review", "",
             f"Of {chosen.describe()}; their texts are below and in the review-outbox artifact.",
             "",
             "Approved messages are delivered once by the deliver-outbox deployment, with their "
             "keys; rejected ones are never sent. The same from a terminal: `runledger outbox "
             "approve ID...` or `runledger outbox reject ID... --reason TEXT`.", ""]
    for h in held:
        m = h.message
        lines += [f"### `{m.message_id[:16]}` {m.channel} to {m.recipient}",
                  f"**{m.subject}** ({h.job} {h.subject}, revision {h.revision})", "",
                  *(f"> {line}" for line in _text(h).splitlines()), ""]
    return "\n".join(lines)


def review_form(held: list[HeldMessage], chosen: Selection) -> type[ReviewForm]:
    """The form for these messages: ReviewForm with a choice per message (titled with its
    recipient and subject, the start of its text below), and the description (Prefect 3.9's
    Resume dialog shows its first line; the artifact holds the whole)."""
    fields: dict[str, Any] = {
        field_name(h.message.message_id): (Each, pydantic.Field(
            default="keep held", title=f"{h.message.recipient}: {h.message.subject}"[:200],
            description=_text(h, FIELD_TEXT_CHARS)))
        for h in held}
    form = pydantic.create_model("ReviewForm", __base__=ReviewForm, **fields)
    form._description = description(held, chosen)
    return form


@dataclass(frozen=True)
class Decided:
    """What a filled form decides: the ids to approve and to reject, by whom and why."""

    approve: list[str]
    reject: list[str]
    kept: list[str]
    by: str
    reason: str | None


def decided(form: ReviewForm, held: list[HeldMessage]) -> Decided:
    """The decisions of a filled form on ``held`` (an "all" choice wins over the per-message
    ones); a message the form does not name stays held."""
    values = form.model_dump()
    every = values["every_message"]
    choice: dict[str, str] = {}
    for h in held:
        each = values.get(field_name(h.message.message_id), "keep held")
        choice[h.message.message_id] = {"approve all": "approve", "reject all": "reject"}.get(
            every, each if each in get_args(Each) else "keep held")
    reason = values["reason"].strip() or None
    return Decided(approve=[i for i, c in choice.items() if c == "approve"],
                   reject=[i for i, c in choice.items() if c == "reject"],
                   kept=[i for i, c in choice.items() if c == "keep held"],
                   by=values["reviewer"].strip() or UI_REVIEWER, reason=reason)
