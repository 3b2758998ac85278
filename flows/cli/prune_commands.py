"""`runledger prune`: turn Runs completed longer ago than the retention into tombstones, in
bounded batches, with a progress bar and a summary of what was removed and reclaimed."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from flows.cli.app import OPERATE, app
from flows.cli.output import console, ledger_session, print_json
from flows.cli.tables import Col, print_table

SUMMARY_COLUMNS = [Col("what"), Col("count")]


@app.command("prune", rich_help_panel=OPERATE)
def prune(
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="DURATION",
        help="Retention: prune Runs completed longer ago than this; whole days, hours or "
             "minutes such as 90d, 36h, 1d12h or 90m.")],
    job: Annotated[str | None, typer.Option("--job", help="Only this registered job.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Count what would be pruned; write nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Runs per transaction (at most 10000).")] = 1000,
) -> None:
    """Turn Runs completed longer ago than the retention into tombstones.

    Keeps a tombstone of each such Run and deletes its bulky data: raw input, output, error and params, its attempts, its sent and dead outbox rows and
    their delivery attempts. A rerun of a pruned period is still a Duplicate. Never touched: a
    Run not completed (pending, running, failed) and a Run with a message still to deliver.

    Refused, nothing written: a retention shorter than a job's reconcile window, the delivery
    retry window or the provider's key retention."""
    from flows.retention import checked_pass

    out = console(stderr=as_json)
    with ledger_session() as ledger:
        show = not as_json and out.is_terminal
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=out, disable=not show) as bar:
            task: list[TaskID] = []

            def progress(done: int, total: int) -> None:
                if not task:
                    task.append(bar.add_task("pruning Runs", total=total))
                bar.update(task[0], completed=done)

            report = checked_pass(ledger, older_than, job, dry_run=dry_run,
                                  batch_size=batch_size, progress=progress)
    if as_json:
        print_json(report.as_dict())
        return
    title = ("dry run: nothing written; " if dry_run else "") + \
        f"Runs completed before {report.cutoff.isoformat(timespec='seconds')}"
    print_table(out, SUMMARY_COLUMNS, [[what, n] for what, n in report.rows()], title=title)
