"""The `outbox` commands: look at messages (`outbox list|show`, `outbox held` for those
waiting for a person, issue 49) and act on them (`outbox approve|reject` by id, by Run or by a
job's period; `outbox requeue` to send one again with its key)."""

from __future__ import annotations

import getpass
import json
from datetime import datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli.app import LOOK, OPERATE, check_choice, outbox_app
from flows.cli.logical_runs import period_label
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.tables import FOLD, Col, decision_text, print_table, short_id, utc
from flows.mail.letter import message_id_for
from flows.registry import get_job
from flows.review.select import Selection, held_messages, selected_ids
from store import CHANNELS, MESSAGE_STATUSES, HeldMessage, QueuedMessage, Run, RunledgerError

# An address is what the list is read for and a folded one is misread: it never folds; the
# run id, the channel and the subject are left out first at 80 columns. "for" is the Run a
# message belongs to (job, subject, period): a webhook's or object's target and subject are
# the same on every row of a job.
OUTBOX_COLUMNS = [Col("message id"), Col("run id", drop=6), Col("channel", drop=5),
                  Col("target"), Col("for", fold=FOLD, drop=3),
                  Col("subject", fold=FOLD, drop=4), Col("status"),
                  Col("attempts", drop=1), Col("next attempt (UTC)", drop=2),
                  Col("last error", fold=FOLD, optional=True)]

# What a reviewer reads a row for: whom it goes to, for which Run (job subject period), and
# when the hold is overdue; the channel and the message's subject go first on a narrow console.
HELD_COLUMNS = [Col("message id"), Col("for", fold=16), Col("channel", drop=3),
                Col("recipient", fold=28), Col("message subject", fold=16, drop=2),
                Col("hold until (UTC)", drop=1)]
PREVIEW_CHARS = 200

Ids = Annotated[list[str] | None, typer.Argument(
    help="Message ids (their keys) or unique prefixes (4+ characters).", show_default=False)]
RunOption = Annotated[str | None, typer.Option(
    "--run", help="Every held message of this Run (its id or a unique prefix).")]
JobName = Annotated[str | None, typer.Option("--job", help="Every held message of this job...")]
Period = Annotated[str | None, typer.Option(
    "--period", help="...in this period (a date such as 2026-12-05, in the job's timezone).")]
By = Annotated[str | None, typer.Option(
    "--by", help="Who decides, recorded with the decision (default: your login name).")]


def run_for(run: Run | None) -> str:
    """The Run a message belongs to, as its job, subject and period (``-`` if pruned)."""
    return "-" if run is None else f"{run.job} {run.subject} {period_label(run)}"


def preview(message: QueuedMessage) -> str:
    """The start of what would go out: an email's body, a webhook's or object's text."""
    payload = message.payload or {}
    text = " ".join((message.body or str(payload.get("text") or payload.get("body") or payload))
                    .split())
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "..."


@outbox_app.command("list", rich_help_panel=LOOK)
def outbox_list(
    status: str | None = typer.Option(None, "--status", help=f"One of {', '.join(MESSAGE_STATUSES)}."),
    run_id: str | None = typer.Option(None, "--run",
                                      help="Only messages of this Run (its id or a unique prefix)."),
    channel: str | None = typer.Option(None, "--channel", help=f"One of {', '.join(CHANNELS)}."),
    limit: int = typer.Option(100, "--limit", min=1,
                              help="Show the newest N messages (default 100)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List outbox messages, newest first; the target is the address, the webhook endpoint,
    or the bucket block and object key."""
    check_choice(status, MESSAGE_STATUSES, "--status")
    check_choice(channel, CHANNELS, "--channel")
    with ledger_session() as ledger:
        run = None if run_id is None else ledger.resolve_run_id(run_id)
        messages = ledger.outbox.recent_messages(status=status, run_id=run, channel=channel,
                                                 limit=limit)
        runs = ledger.get_many(list(dict.fromkeys(m.run_id for m in messages)))
    if as_json:
        print_json([m.model_dump(mode="json", exclude={"body", "payload"}) for m in messages])
        return
    out = console()
    print_table(out, OUTBOX_COLUMNS, [
        [short_id(m.message_id), short_id(m.run_id), m.channel, m.recipient,
         run_for(runs.get(m.run_id)), m.subject, m.status, str(m.attempts),
         utc(m.next_attempt_at), m.last_error or ""] for m in messages])
    if len(messages) == limit:
        out.print(f"the newest {limit}; older ones with a larger --limit", highlight=False)


@outbox_app.command("requeue", rich_help_panel=OPERATE)
def outbox_requeue(message_id: str = typer.Argument(
        ..., help="The outbox message id (its key), or a unique prefix of it (4+ characters).")
) -> None:
    """Make a retry, uncertain or dead message due now; it is resent with the same key."""
    with ledger_session() as ledger:
        message_id = ledger.outbox.resolve_message_id(message_id)
        before = ledger.outbox.message(message_id)
        message = ledger.outbox.requeue_message(message_id)
    out = console()
    same_key = (f"Message-ID {message_id_for(message.message_id)}" if message.channel == "email"
                else f"key {message.message_id}")
    out.print(f"{message.channel} message {message.message_id} to {escape(message.recipient)} is "
              f"{message.status}, due now, {same_key}")
    if before is not None and before.status == "uncertain" and message.channel != "email":
        out.print("[yellow]note:[/] it was uncertain: before sending it again the dispatcher asks "
                  "the receiver where it can (a webhook's status lookup, an object's HEAD); "
                  "otherwise the copy carries the same key")
    elif before is not None and before.status == "uncertain":
        out.print("[yellow]note:[/] it was uncertain: the receiver may already have it; the "
                      "copy carries the same Message-ID so it can be recognised")


@outbox_app.command("show", rich_help_panel=LOOK)
def outbox_show(
    message_id: str = typer.Argument(
        ..., help="The outbox message id (its key), or a unique prefix of it (4+ characters)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one outbox message and every delivery attempt."""
    with ledger_session() as ledger:
        message_id = ledger.outbox.resolve_message_id(message_id)
        message = ledger.outbox.message(message_id)
        attempts = ledger.outbox.delivery_attempts(message_id)
    if message is None:
        raise fail(RunledgerError(f"no outbox message with id {message_id!r}"))
    if as_json:
        print_json({"message": message.model_dump(mode="json"),
                    "attempts": [a.model_dump(mode="json") for a in attempts]})
        return
    out = console()
    key = (f"Message-ID {message_id_for(message.message_id)}" if message.channel == "email"
           else f"{message.channel}, key {message.message_id}")
    out.print(f"[bold]{escape(message.recipient)}[/] {escape(repr(message.subject))}\nmessage "
              f"{message.message_id} ({key}) run {message.run_id}\n"
                  f"status [bold]{message.status}[/], attempts {message.attempts}, next attempt "
                  f"{message.next_attempt_at or '-'}, last error {message.last_error or '-'}")
    if message.decision is not None or message.status == "held":
        decided = decision_text(message.decision, message.decided_by, message.decided_at,
                                message.decision_reason)
        out.print(escape(decided or f"held for approval, overdue at {utc(message.hold_until)}"),
                  highlight=False)
    if message.payload is not None:
        out.print(f"channel {message.channel}, payload:")
        out.print(escape(json.dumps(message.payload, indent=2, ensure_ascii=False)[:4000]))
    table = Table("attempt", "owner", "started", "finished", "outcome", "reply", "provider id")
    for a in attempts:
        table.add_row(str(a.attempt), a.owner, str(a.started_at), str(a.finished_at), a.outcome,
                      f"{a.reply_code or ''} {a.reply_text or ''}".strip(),
                      a.provider_message_id or "")
    out.print(table)


@outbox_app.command("held", rich_help_panel=LOOK)
def outbox_held(
    job: JobName = None, period: Period = None, run: RunOption = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON (with each message's text)."),
) -> None:
    """List the outbox messages waiting for a person's approval, oldest first.

    Each is sent only once approved (`runledger outbox approve`, or the review-outbox flow run's
    form in the Prefect UI); a rejected one is never sent."""
    with ledger_session() as ledger:
        held = held_messages(ledger, job, period, run)
        now = ledger.now()
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
    with ledger_session() as ledger:
        decided = ledger.outbox.decide(selected_ids(ledger, chosen), decision, who, reason)
    out = console()
    after = ("due now: the next deliver pass sends each once, with its key" if decision ==
             "approved" else "never sent; they stay listed as rejected")
    out.print(f"{decision} {len(decided)} message(s) by {escape(who)}: {after}", highlight=False)
    for m in decided:
        out.print(f"  {m.message_id} {m.channel} {escape(m.recipient)} {m.status}",
                  highlight=False)


@outbox_app.command("approve", rich_help_panel=OPERATE)
def outbox_approve(
    ids: Ids = None, run: RunOption = None, job: JobName = None, period: Period = None, by: By = None,
    reason: str | None = typer.Option(None, "--reason", help="Why, recorded with the decision."),
) -> None:
    """Approve held messages: each becomes due now and is delivered once with its key.

    Name them by id, by --run, or by --job with --period. All or none: an unknown message, or one
    that is not held (sent, rejected, already approved), refuses the whole decision."""
    _decide("approved", Selection(ids or (), run, job, period), by, reason)


@outbox_app.command("reject", rich_help_panel=OPERATE)
def outbox_reject(
    ids: Ids = None, run: RunOption = None, job: JobName = None, period: Period = None, by: By = None,
    reason: str = typer.Option(..., "--reason", help="Why, recorded with the decision."),
) -> None:
    """Reject held messages with a reason: they are never sent and stay listed as rejected.

    Name them by id, by --run, or by --job with --period. All or none, as for approve."""
    _decide("rejected", Selection(ids or (), run, job, period), by, reason)
