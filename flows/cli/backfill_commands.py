"""`runledger backfill JOB --from DATE --to DATE`: a job's past periods through the backfill
flow, in this process, with a progress bar and a summary; `--dry-run` only shows the plan."""

from __future__ import annotations

from collections import Counter
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from flows.cli.app import RUN_WORK, app
from flows.cli.flow_runs import run_here
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.run_commands import STYLES
from flows.cli.tables import FOLD, Col, print_table, short_id
from flows.jobs.schedule import NOT_DUE_FLAG
from store import RunledgerError

if TYPE_CHECKING:
    from prefect import State

    from flows.backfill.plan import Plan
    from flows.backfill.report import BackfillReport, PeriodResult

SHOWN = ("new", "duplicate", "failed")  # always in the progress bar, even at 0


@app.command("backfill", rich_help_panel=RUN_WORK)
def backfill_command(
    job: Annotated[str, typer.Argument(help="A registered job, e.g. competitor-summary.")],
    start: Annotated[str, typer.Option(
        "--from", help="The first period: a date YYYY-MM-DD in the job's timezone, or an ISO "
                       "datetime with an offset.")],
    end: Annotated[str, typer.Option(
        "--to", help="The last period (included), the same way; not one that is not yet due.")],
    subject: Annotated[list[str] | None, typer.Option(
        "--subject", "-s", help="A subject to run (repeatable); default: all of the job's.")] = None,
    reprocess: Annotated[str, typer.Option(
        "--reprocess", metavar="none|failed|skipped",
        help="Also run failed Runs (requeued) or skipped occurrences (skip cleared); "
             "completed Runs are never run again.")] = "none",
    max_active: Annotated[int, typer.Option(
        "--max-active", help="Periods running at once, across every backfill of the job.")] = 2,
    rate: Annotated[str | None, typer.Option(
        "--rate", metavar="N/min", help="Start at most N periods a minute.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what would run, period by period; write nothing.")] = False,
    allow_not_due: Annotated[bool, typer.Option(
        NOT_DUE_FLAG, help="Let --to be a period not due yet (refused otherwise: a completed "
                           "Run never changes).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Run JOB's past periods from --from to --to through the backfill flow.

    Each period is a run-job subflow of the backfill flow, oldest first. Completed Runs are not
    run again: the same command again continues where it stopped. Exit status 1 if any subject
    failed.

    Uses the Prefect server at PREFECT_API_URL, or a temporary local one. The ledger schema
    is created or migrated first (not for a dry run), as by `runledger db upgrade`."""
    from flows.backfill.plan import read_plan
    from flows.backfill.request import check, parse_rate
    from flows.registry import upgrade_ledger

    # Job, range, subjects and options are checked before any ledger or server is touched
    # (by this host's clock; the flow checks again by the database's).
    try:
        request = check(job, start, end, subject, reprocess, max_active,
                        parse_rate(rate) if rate is not None else None, datetime.now(UTC),
                        allow_not_due)
    except RunledgerError as exc:
        raise fail(exc, code=2) from None
    with ledger_session() as ledger:
        if dry_run:
            planned = read_plan(ledger, request)
        else:
            upgrade_ledger(ledger)
    if dry_run:
        _print_plan(planned, as_json)
        return
    out = console(stderr=as_json)
    from flows.backfill.drive import watching
    from flows.backfill.report import BackfillReport

    def call() -> Coroutine[Any, Any, State[Any]]:
        from flows.backfill.flow import backfill

        return cast("Coroutine[Any, Any, State[Any]]", backfill(
            job=job, start=start, end=end, subjects=subject or None,
            reprocess=request.reprocess, max_active=max_active,
            rate_per_minute=request.rate_per_minute, allow_not_due=allow_not_due,
            return_state=True))

    def stopped() -> None:
        console(stderr=True).print(
            f"stopped the backfill of {job} {start}..{end}: periods not started were not "
            "registered; the same command again continues where it stopped "
            f"(runledger runs list --job {job})", markup=False, highlight=False)

    bar = _ProgressBar(out, len(request.periods) * len(request.subjects))
    with bar:
        value, state = run_here(call, BackfillReport, watching(bar.advance),
                                what=f"the backfill of {job} {start}..{end}", stopped=stopped)
    if as_json:
        print_json({**value.as_dict(), "flow_run_id": str(state.state_details.flow_run_id)})
    else:
        _print_report(out, value)
    if value.failed():
        raise typer.Exit(1)


class _ProgressBar:
    """periods x subjects, advanced as each period's result comes back, with its counts."""

    def __init__(self, console: Console, total: int) -> None:
        self.counts: Counter[str] = Counter()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task(self._description(), total=total)

    def _description(self) -> str:
        shown = [f"{self.counts[c]} {c}" for c in SHOWN]
        shown += [f"{n} {c}" for c, n in self.counts.items() if c not in SHOWN and n]
        return ", ".join(shown)

    def advance(self, result: PeriodResult) -> None:
        self.counts.update(result.counts())
        self.progress.update(self.task, advance=len(result.planned.run_ids),
                             description=self._description())

    def __enter__(self) -> _ProgressBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


# The period and its counts are what the table is read for; flow run ids and errors go first.
REPORT_COLUMNS = [Col("period"), Col("new"), Col("duplicate"), Col("failed"),
                  Col("skipped", optional=True), Col("other", fold=FOLD, optional=True),
                  Col("flow run", drop=2), Col("error", fold=FOLD, optional=True)]


def _print_report(console: Console, report: BackfillReport) -> None:
    rows: list[list[str | Text]] = []
    for result in report.results:
        counts = result.counts()
        other = ", ".join(f"{n} {c}" for c, n in counts.items()
                          if c not in (*SHOWN, "skipped"))
        rows.append([result.label, str(counts["new"]), str(counts["duplicate"]),
                     Text(str(counts["failed"]), style=STYLES["failed"] if counts["failed"]
                          else ""),
                     str(counts["skipped"] or ""), other,
                     short_id(result.flow_run_id) if result.flow_run_id else "-",
                     result.error or ""])
    print_table(console, REPORT_COLUMNS, rows, title=report.summary())


PLAN_COLUMNS = [Col("period"), Col("to run", fold=FOLD), Col("completed"), Col("failed"),
                Col("skipped"), Col("first", drop=1, optional=True)]


def _print_plan(planned: Plan, as_json: bool) -> None:
    from flows.backfill.report import BackfillReport

    if as_json:
        print_json(BackfillReport(planned, dry_run=True).as_dict())
        return
    rows: list[list[str | Text]] = []
    for p in planned.periods:
        first = [f"requeue {len(p.requeue)}" if p.requeue else "",
                 f"unskip {len(p.unskip)}" if p.unskip else ""]
        rows.append([p.period.label, ", ".join(p.run) or "-", str(len(p.completed)),
                     str(len(p.failed)), str(len(p.skipped)), " ".join(filter(None, first))])
    print_table(console(), PLAN_COLUMNS, rows, title="dry run: " + planned.summary())
