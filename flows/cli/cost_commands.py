"""`runledger costs`: what each job spent on its model from a day on (calls paid, lost in
flight, reused from a checkpoint, tokens, money per currency; revisions apart) and what the
duplicates the ledger suppressed would have cost: each duplicate Run's answered calls'
stored cost, measured when the tick suppressed it; a line per job whose prompts were read
from (or written to) the provider's prompt cache, and one per job whose provider billed
answers beyond the bound their calls reserved (reads only)."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.app import LOOK, app
from flows.cli.output import console, ledger_session, print_json
from flows.cli.stats_commands import checked_window, window_start
from flows.cli.tables import FOLD, Col, print_table
from flows.spend import JobCosts, cache_text, cost_text, job_costs
from flows.stats import daily_stats

COLUMNS = [Col("job", fold=FOLD), Col("calls paid"), Col("lost", drop=2), Col("reused", drop=2),
           Col("tokens", drop=3), Col("spent", fold=FOLD), Col("revisions", fold=FOLD, drop=1),
           Col("duplicates"), Col("saved", fold=FOLD),
           Col("batch saving", fold=FOLD, optional=True)]


def _row(costs: JobCosts) -> list[str]:
    spent, revised = costs.spent, costs.revisions
    return [costs.job, str(spent.paid), str(spent.lost), str(spent.reused), str(spent.tokens),
            spent.money(),
            f"{revised.paid} calls, {revised.money()}" if revised.paid else "-",
            str(costs.duplicates),
            cost_text(costs.saved) if costs.saved else
            (f"{costs.saved_tokens} tokens" if costs.saved_tokens else "-"),
            f"{cost_text(spent.batch_saved)} on {spent.batched} batched calls"
            if spent.batched else ""]


@app.command("costs", rich_help_panel=LOOK)
def costs(
    job: Annotated[str | None, typer.Option("--job", help="Only this registered job.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="First UTC day, YYYY-MM-DD; default: six days before today.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Say per job what its model calls cost from a UTC day on, and what the ledger saved.

    Model calls paid (answered, failed, or lost in flight), lost, answers reused from a
    checkpoint instead of paid again, tokens and cost (a model without a price shows its tokens
    and "no price"), revisions apart; the duplicate Runs suppressed and what they would have
    cost had they run again (each one's answered calls as stored: the money the ledger
    saved, measured). A job some of whose answers were billed beyond the bound their calls
    reserved (a provider that did not honour max_tokens) gets a line saying how many and by
    how many tokens; a job whose prompts were read from (or written to) the provider's prompt
    cache, a line saying how many tokens (priced apart). A job whose calls went through a
    provider's Batch API shows what that saved against the synchronous price (each call's
    two prices, as they were when its batch was settled). Reads only."""
    start = checked_window(job, since)
    with ledger_session() as ledger:
        start = window_start(ledger, start)
        duplicates: dict[str, int] = {}
        for day in daily_stats(ledger.activity(start, job), start):
            duplicates[day.job] = duplicates.get(day.job, 0) + day.duplicates
        found = job_costs(ledger.calls.since(start, job), ledger.calls.saved_since(start.date(), job),
                          duplicates)
    if as_json:
        print_json({"since": start.date().isoformat(), "jobs": [c.as_dict() for c in found]})
        return
    if not found:
        console().print(f"nothing recorded since {start.date().isoformat()} (UTC)")
        return
    print_table(console(), COLUMNS, [_row(c) for c in found])
    for line in [*cache_lines(found), *overrun_lines(found)]:
        console().print(line)


def cache_lines(found: list[JobCosts]) -> list[str]:
    """One line per job whose prompts were partly read from (or written to) the provider's
    prompt cache: those tokens are priced apart (the model's cached_input and cache_write)."""
    lines = []
    for c in found:
        cache = cache_text(c.spent.cached_tokens + c.revisions.cached_tokens,
                           c.spent.cache_write_tokens + c.revisions.cache_write_tokens)
        if cache:
            lines.append(f"{c.job}: of its prompt tokens, {cache} (the provider's prompt cache, "
                         "priced apart)")
    return lines


def overrun_lines(found: list[JobCosts]) -> list[str]:
    """One line per job some of whose answers were billed beyond their call's bound: what a
    budget may have been passed by, never hidden."""
    lines = []
    for c in found:
        over = c.spent.overran + c.revisions.overran
        if over:
            tokens = c.spent.overrun_tokens + c.revisions.overrun_tokens
            lines.append(
                f"{c.job}: {over} answer{'s' if over != 1 else ''} billed {tokens} tokens "
                "beyond their calls' bound (the provider did not honour max_tokens): its "
                "budget may be passed by that much; see the runledger.budget.overrun events")
    return lines
