"""`runledger batches`: settle the batches that ended and finish their Runs (`poll`, what the
settle-batches deployment runs on its schedule), look at them (`list`, `show`) and stop
waiting for one (`cancel`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from flows.cli.app import LOOK, OPERATE, RUN_WORK, batches_app, check_choice
from flows.cli.flow_runs import run_here
from flows.cli.logical_runs import period_label
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.tables import FOLD, Col, print_table, short_id, utc
from flows.prices import format_money
from store import BATCH_STATUSES, Batch, TickRef

if TYPE_CHECKING:
    from prefect import State

    from flows.settle.flow import SettleReport

LIST_COLUMNS = [Col("batch"), Col("provider id", fold=FOLD), Col("status"),
                Col("requests"), Col("answered / refused / failed / again / sync", fold=FOLD, drop=2),
                Col("tick", fold=FOLD), Col("age", drop=1), Col("cost", fold=FOLD, drop=3)]
POLL_COLUMNS = [Col("batch"), Col("provider id", fold=FOLD), Col("now"), Col("provider status"),
                Col("settled"), Col("requeued", drop=2), Col("withdrawn", drop=2),
                Col("Runs released", drop=1),
                Col("Runs failed", drop=1), Col("error", fold=FOLD, optional=True)]


@batches_app.command("poll", rich_help_panel=RUN_WORK)
def poll(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Settle every batch that ended and finish its Runs, through the settle-batches flow.

    Each due batch is taken under a lease (another poller leaves it alone): one never
    created at its provider is created (found there first, by its key, if an earlier
    submitter may have created it); one still running is left to run; one that ended has
    each result settled once (answers checkpointed at the batch price), its calls without a
    result queued into a new batch (or, their deadline near, withdrawn and called
    synchronously: RUNLEDGER_BATCH_DEADLINE_SECONDS), and its Runs run again: each transform
    replays its answer, and the Run completes with its outbox rows. One still running past its
    deadline is cancelled. A tick whose Runs no longer wait is
    marked completed in the Prefect UI. Uses the Prefect server at PREFECT_API_URL, or a
    temporary local one.

    Exit status: 0 when every due batch was polled; 1 when a batch could not be (its provider
    unreachable, say: the next poll tries again)."""
    from flows.settle.flow import SettleReport

    async def call() -> State[Any]:
        from flows.registry import upgrade_ledger
        from flows.settle.flow import settle_batches

        def ready() -> None:
            with ledger_session() as ledger:
                upgrade_ledger(ledger)

        await asyncio.to_thread(ready)
        return await cast("Coroutine[Any, Any, State[Any]]",
                          settle_batches(return_state=True))

    report, state = run_here(call, SettleReport, what="settle-batches")
    if as_json:
        print_json({"flow_run_id": str(state.state_details.flow_run_id),
                    "summary": report.summary(),
                    "batches": [_polled_dict(p) for p in report.polled],
                    "ticks": [r.as_dict() for r in report.reruns]})
    else:
        _print_poll(report)
    if state.is_failed():
        raise typer.Exit(1)


def _polled_dict(p: Any) -> dict[str, Any]:
    return {"key": p.key, "job": p.job, "endpoint": p.endpoint, "action": p.action,
            "provider_batch_id": p.provider_batch_id, "provider_status": p.provider_status,
            "settled": p.settled, "requeued": p.requeued, "withdrawn": p.withdrawn,
            "released": [r.run_id for r in p.released], "failed": [r.run_id for r in p.failed],
            "resubmitted": [s.key for s in p.resubmitted], "error": p.error}


def _print_poll(report: SettleReport) -> None:
    out = console()
    print_table(out, POLL_COLUMNS, [
        [p.key, p.provider_batch_id or "-", p.action, p.provider_status or "-", str(p.settled),
         str(p.requeued), str(p.withdrawn), str(len(p.released)), str(len(p.failed)), p.error or ""]
        for p in report.polled], title=f"settle-batches: {report.summary()}")


@batches_app.command("list", rich_help_panel=LOOK)
def list_batches(
    status: Annotated[str | None, typer.Option(
        "--status", help="Only batches in this state: open, submitted or settled.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List batches, newest first: the provider's id and status, request counts, the tick
    that opened each, its age and what its answers cost (at the batch price). Reads only."""
    check_choice(status, BATCH_STATUSES, "--status")
    with ledger_session() as ledger:
        now = ledger.now()
        found = ledger.batches.list_batches(limit=limit, status=status)
    if as_json:
        print_json([_batch_dict(b, now) for b in found])
        return
    print_table(console(), LIST_COLUMNS, [_batch_row(b, now) for b in found],
                title=f"{len(found)} batch(es)")


@batches_app.command("show", rich_help_panel=LOOK)
def show(
    batch: Annotated[str, typer.Argument(help="A batch's key (rb-...) or its provider's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one batch and each model call it holds: its Run, outcome, tokens and cost. Reads
    only."""
    with ledger_session() as ledger:
        now = ledger.now()
        found = ledger.batches.get(batch)
        if found is None:
            raise fail(f"no batch {batch!r}: give a key from `runledger batches list` (rb-...) "
                       "or the provider's batch id", code=2)
        calls = ledger.batches.calls_of(found.batch_key)
    if as_json:
        print_json({**_batch_dict(found, now),
                    "calls": [c.model_dump(exclude={"answer", "request"}) for c in calls]})
        return
    out = console()
    for name, value in _batch_dict(found, now).items():
        out.print(f"{name}: {value}", markup=False, highlight=False)
    print_table(out, [Col("run id"), Col("custom id", fold=FOLD), Col("outcome"),
                      Col("tokens", drop=1), Col("cost", drop=2), Col("error", fold=FOLD,
                                                                       optional=True)],
                [[short_id(c.run_id), c.custom_id or "-", c.outcome or "-",
                  str((c.prompt_tokens or 0) + (c.completion_tokens or 0)),
                  format_money(c.cost_nanos, c.currency), c.error or ""] for c in calls],
                title=f"{len(calls)} model call(s)")


@batches_app.command("cancel", rich_help_panel=OPERATE)
def cancel(
    batch: Annotated[str, typer.Argument(help="A batch's key (rb-...) or its provider's id.")],
) -> None:
    """Stop waiting for a batch: its deadline moves to now.

    The next poll (`runledger batches poll`, or the settle-batches deployment's schedule)
    asks the provider to cancel it; once it ended, its answers are settled at the batch price
    and the requests it did not run are called synchronously, each once. A batch never
    created at its provider is not created: its calls are called synchronously.

    Exit status: 0 when the batch's deadline moved; 2, with one line saying why, for an
    unknown batch, one already settled or one already past its deadline."""
    with ledger_session() as ledger:
        found = ledger.batches.get(batch)
        if found is None:
            raise fail(f"no batch {batch!r}: give a key from `runledger batches list` (rb-...) "
                       "or the provider's batch id", code=2)
        if not ledger.batches.stop_waiting(found.batch_key):
            why = ("it is settled" if found.status == "settled" else
                   f"it is past its deadline ({utc(found.deadline_at)}) already")
            raise fail(f"batch {found.batch_key} was not cancelled: {why}; "
                       "`runledger batches show` tells what became of its calls", code=2)
    console().print(f"batch {found.batch_key} ({found.provider_batch_id or 'not created'}): its "
                    "deadline is now; the next `runledger batches poll` cancels it at its "
                    "provider and calls synchronously what it did not answer", markup=False,
                    highlight=False)


def _tick(b: Batch) -> str:
    """The job and period of the tick that opened the batch (``-``: a poll swept it)."""
    if b.period_start is None:
        return f"{b.job}/-"
    return f"{b.job}/{period_label(TickRef(b.flow_run_id or '', b.job, b.period_start))}"


def _age(b: Batch, now: datetime) -> str:
    if b.created_at is None:
        return "-"
    seconds = int((now - b.created_at).total_seconds())
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 \
        else f"{seconds // 60}m{seconds % 60:02d}s"


def _status(b: Batch) -> str:
    return b.status if not b.provider_status else f"{b.status} ({b.provider_status})"


def _batch_row(b: Batch, now: datetime) -> list[str]:
    settled = (f"{b.answered} / {b.refused} / {b.failed} / {b.requeued} / {b.withdrawn}"
               if b.status == "settled" else
               f"provider: {b.provider_completed or 0} done, {b.provider_failed or 0} failed")
    return [b.batch_key, b.provider_batch_id or "-", _status(b), str(b.requests), settled,
            _tick(b), _age(b, now),
            format_money(b.cost_nanos, b.currency) if b.status == "settled" else "-"]


def _batch_dict(b: Batch, now: datetime) -> dict[str, Any]:
    return {"key": b.batch_key, "provider_batch_id": b.provider_batch_id,
            "provider_file_id": b.provider_file_id, "status": b.status,
            "provider_status": b.provider_status, "job": b.job, "endpoint": b.endpoint,
            "model": b.model, "kind": b.kind, "tick": _tick(b), "flow_run_id": b.flow_run_id,
            "requests": b.requests, "input_digest": b.input_digest,
            "provider_total": b.provider_total, "provider_completed": b.provider_completed,
            "provider_failed": b.provider_failed, "answered": b.answered,
            "refused": b.refused, "failed": b.failed, "requeued": b.requeued,
            "withdrawn": b.withdrawn, "deadline_at": utc(b.deadline_at),
            "cost": format_money(b.cost_nanos, b.currency), "created_at": utc(b.created_at),
            "submitted_at": utc(b.submitted_at), "polled_at": utc(b.polled_at),
            "settled_at": utc(b.settled_at), "age": _age(b, now), "error": b.error}
