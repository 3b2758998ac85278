"""`runledger status [JOB]`: each job's status board, from the ledger (reads only)."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.app import LOOK, app
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.tables import FOLD, Col, print_table
from flows.cli.unfinished import fields, of_jobs, print_unfinished
from store import RunledgerError

# The counts are what a board is read for; the costs go first on a narrow console.
BOARD_COLUMNS = [Col("period"), Col("owed", drop=3), Col("completed"), Col("pending"),
                 Col("running"), Col("failed"), Col("skipped"), Col("overdue"),
                 Col("attempts", drop=1), Col("model calls", drop=2), Col("tokens", drop=4),
                 Col("cost", fold=FOLD, drop=3)]
MAX_PERIODS = 1_000  # a board reads every Run of the periods it shows


@app.command("status", rich_help_panel=LOOK)
def status(
    job: Annotated[str | None, typer.Argument(
        help="A registered job; default: every job.")] = None,
    periods: Annotated[int, typer.Option(
        "--periods", min=1, max=MAX_PERIODS,
        help="How many of each job's latest owed periods to show.")] = 7,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (times in UTC).")] = False,
) -> None:
    """Show each job's status board, from the ledger.

    Its last period whose every owed subject completed, its latest owed periods with their occurrences counted by status (completed, pending, running,
    failed, skipped by policy, overdue), the next period due, and the attempts, model calls,
    tokens and cost the periods shown spent (their Runs' calls, as `runledger costs` reads
    them). Then every unfinished Run of the job's version, whatever its period: held (who holds
    its lease, until when), stranded (its lease ended), over-budget or pending, with a summary
    line such as "3 unfinished Runs: 1 held, 1 over-budget, 1 pending" and what to do about
    each kind. Reads only; the same board (without the unfinished Runs) is each job's
    runledger-status-<job> artifact in Prefect's UI."""
    from flows.board import STATUSES, job_board
    from flows.registry import get_job, registered_jobs

    try:
        jobs = [get_job(job)] if job else list(registered_jobs().values())
    except RunledgerError as exc:
        raise fail(exc) from exc
    with ledger_session() as ledger:
        now = ledger.now()
        boards = [job_board(ledger, one, now, periods) for one in jobs]
        unfinished = of_jobs(ledger, jobs, now)
    held = {board.job.name: [run for run in unfinished if run.job == board.job.name]
            for board in boards}
    if as_json:
        print_json([{**board.as_dict(), "unfinished": [fields(run) for run in held[board.job.name]]}
                    for board in boards])
        return
    out = console()
    for board in boards:
        rows = [[r["period"], str(r["owed"]), *(str(r[s]) for s in STATUSES),
                 str(r["attempts"]), str(r["model_calls"]), str(r["tokens"]), r["cost"]]
                for r in board.rows()]
        out.print(board.summary(), markup=False, highlight=False)
        if rows:
            print_table(out, BOARD_COLUMNS, rows)
        print_unfinished(out, held[board.job.name])
