"""`runledger reconcile [JOB]`: compare what jobs owe with the ledger and act, or (--dry-run)
only say what would be done."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from flows.cli.app import RUN_WORK, app
from flows.cli.flow_runs import run_here
from flows.cli.output import console, fail, ledger_session, print_json
from flows.cli.tables import FOLD, Col, print_table, short_id
from store import RunledgerError

if TYPE_CHECKING:
    from prefect import State

    from flows.reconcile.flow import JobReconciled

# What is owed and not completed is what a person reads this for; completed ones are counted.
# One table per job, named in its title.
STEP_COLUMNS = [Col("subject", fold=FOLD), Col("period"), Col("state"),
                Col("action"), Col("overdue", drop=2), Col("run id", drop=1),
                Col("reason", fold=FOLD, optional=True)]


@app.command("reconcile", rich_help_panel=RUN_WORK)
def reconcile(
    job: Annotated[str | None, typer.Argument(
        help="A registered job; default: every job.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only say what would be done: write nothing, run nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Compare what each job owes with the ledger and act on the difference.

    Runs missed periods as the job's missed-run policy says (or records them skipped),
    re-drives stranded Runs up to the job's attempt cap, and reports overdue and recovered
    occurrences (Prefect events).

    Runs the reconcile flow on the Prefect server at PREFECT_API_URL, or a temporary local one;
    --dry-run needs no Prefect server. Exits 1 when a period it ran failed."""
    from flows.occurrences.prepare import prepare
    from flows.reconcile.flow import JobReconciled
    from flows.registry import get_job, registered_jobs

    try:
        jobs = [get_job(job)] if job else list(registered_jobs().values())
    except RunledgerError as exc:
        raise fail(exc) from exc
    if dry_run:
        with ledger_session() as ledger:
            results = [JobReconciled(prepare(ledger, j, dry_run=True), dry_run=True)
                       for j in jobs]
    else:
        def call() -> Coroutine[Any, Any, State[Any]]:
            from flows.reconcile.flow import reconcile as reconcile_flow

            return cast("Coroutine[Any, Any, State[Any]]", reconcile_flow(
                job=job, dry_run=False, return_state=True))

        results = cast("list[JobReconciled]", run_here(call, list)[0])
    _show(results, as_json)
    if any(t.state_name() == "Failed" for r in results for t in r.ticks):
        raise typer.Exit(1)


def _show(results: list[JobReconciled], as_json: bool) -> None:
    if as_json:
        print_json([r.as_dict() for r in results])
        return
    out = console()
    for result in results:
        rows = [[r["subject"], r["period"], r["state"], r["action"],
                 "yes" if r["overdue"] else "", short_id(r["run_id"]), r["reason"]]
                for r in result.rows() if r["state"] != "completed"]
        if rows:
            print_table(out, STEP_COLUMNS, rows, title=result.summary())
        else:
            out.print(result.summary(), markup=False, highlight=False)
