"""Approval commands (issue 49): `outbox held` lists the messages waiting for a person;
`outbox approve` and `outbox reject` decide them, by id, by Run or by a job's period."""

from __future__ import annotations

import getpass
from datetime import datetime
from typing import Annotated

import typer
from rich.markup import escape

from flows.cli.app import outbox_app
from flows.cli.output import console, fail, open_ledger, print_json
from flows.cli.tables import Col, print_table, short_id, utc
from flows.registry import get_job
from flows.review.select import Selection, held_messages, selected_ids
from store import HeldMessage, QueuedMessage, RunledgerError

# What a reviewer reads a row for: whom it goes to, for which Run (job subject period), and
# when the hold is overdue; the channel and the message's subject go first on a narrow console.
HELD_COLUMNS = [Col("message id"), Col("for", fold=16), Col("channel", drop=3),
                Col("recipient", fold=28), Col("message subject", fold=16, drop=2),
                Col("hold until (UTC)", drop=1)]
PREVIEW_CHARS = 200

Ids = Annotated[list[str] | None, typer.Argument(
    help="Message ids (their keys) or unique prefixes (4+ characters).", show_default=False)]
Run = Annotated[str | None, typer.Option(
    "--run", help="Every held message of this Run (its id or a unique prefix).")]
JobName = Annotated[str | None, typer.Option("--job", help="Every held message of this job...")]
Period = Annotated[str | None, typer.Option(
    "--period", help="...in this period (a date such as 2026-12-05, in the job's timezone).")]
By = Annotated[str | None, typer.Option(
    "--by", help="Who decides, recorded with the decision (default: your login name).")]


def preview(message: QueuedMessage) -> str:
    """The start of what would go out: an email's body, a webhook's or object's text."""
    payload = message.payload or {}
    text = " ".join((message.body or str(payload.get("text") or payload.get("body") or payload))
                    .split())
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "..."


@outbox_app.command("held")
def outbox_held(
    job: JobName = None, period: Period = None, run: Run = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON (with each message's text)."),
) -> None:
    """List the outbox messages waiting for a person's approval, oldest first.

    Each is sent only once approved (`runledger outbox approve`, or the review-outbox flow run's
    form in the Prefect UI); a rejected one is never sent."""
    ledger = open_ledger()
    try:
        held = held_messages(ledger, job, period, run)
        now = ledger.now()
    except RunledgerError as exc:
        raise fail(exc) from exc
    finally:
        ledger.close()
    if as_json:
        print_json([{**h.message.model_dump(mode="json"), "job": h.job, "subject_name": h.subject,
                     "period_start": h.period_start.isoformat(), "revision": h.revision,
                     "overdue": h.message.hold_until is not None and h.message.hold_until <= now}
                    for h in held])
        return
    out = console()
    if not held:
        out.print("no message is waiting for approval")
        return
    print_table(out, HELD_COLUMNS, [_row(h, now) for h in held],
                title=f"{len(held)} message(s) waiting for approval")
    for h in held:
        out.print(f"[bold]{short_id(h.message.message_id)}[/] {escape(preview(h.message))}",
                  highlight=False)


def _row(h: HeldMessage, now: datetime) -> list[str]:
    until = h.message.hold_until
    overdue = until is not None and until <= now
    return [short_id(h.message.message_id), f"{h.job} {h.subject} {_period(h)}",
            h.message.channel, h.message.recipient, h.message.subject,
            utc(until) + (" OVERDUE" if overdue else "")]


def _period(h: HeldMessage) -> str:
    """The Run's period as its job labels it; its UTC start when the job is unknown here."""
    try:
        return str(get_job(h.job).period_at(h.period_start).label)
    except RunledgerError:
        return utc(h.period_start)


def _decide(decision: str, chosen: Selection, by: str | None, reason: str | None) -> None:
    who = by or getpass.getuser()
    ledger = open_ledger()
    try:
        decided = ledger.outbox.decide(selected_ids(ledger, chosen), decision, who, reason)
    except RunledgerError as exc:
        raise fail(exc) from exc
    finally:
        ledger.close()
    out = console()
    after = ("due now: the next deliver pass sends each once, with its key" if decision ==
             "approved" else "never sent; they stay listed as rejected")
    out.print(f"{decision} {len(decided)} message(s) by {escape(who)}: {after}", highlight=False)
    for m in decided:
        out.print(f"  {m.message_id} {m.channel} {escape(m.recipient)} {m.status}",
                  highlight=False)


@outbox_app.command("approve")
def outbox_approve(
    ids: Ids = None, run: Run = None, job: JobName = None, period: Period = None, by: By = None,
    reason: str | None = typer.Option(None, "--reason", help="Why, recorded with the decision."),
) -> None:
    """Approve held messages: each becomes due now and is delivered once with its key.

    Name them by id, by --run, or by --job with --period. All or none: an unknown message, or one
    that is not held (sent, rejected, already approved), refuses the whole decision."""
    _decide("approved", Selection(ids or (), run, job, period), by, reason)


@outbox_app.command("reject")
def outbox_reject(
    ids: Ids = None, run: Run = None, job: JobName = None, period: Period = None, by: By = None,
    reason: str = typer.Option(..., "--reason", help="Why, recorded with the decision."),
) -> None:
    """Reject held messages with a reason: they are never sent and stay listed as rejected.

    Name them by id, by --run, or by --job with --period. All or none, as for approve."""
    _decide("rejected", Selection(ids or (), run, job, period), by, reason)
