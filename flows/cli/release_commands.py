"""`runledger runs release RUN | --owner OWNER`: take over the leases of workers the operator
says are dead, instead of waiting for the leases to end."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.app import runs_app
from flows.cli.logical_runs import period_label
from flows.cli.output import console, fail, open_ledger
from flows.cli.tables import short_id
from store import RunledgerError

REFUSED_EXIT = 2  # an unknown Run, a Run that holds no lease, an owner that holds none


@runs_app.command("release")
def runs_release(
    run_id: Annotated[str | None, typer.Argument(
        help="A running Run's id, or a unique prefix of it (4+ characters).")] = None,
    owner: Annotated[str | None, typer.Option(
        "--owner", help="Release every Run this lease owner holds (as `runledger status` "
                        "shows it, e.g. host:pid), instead of one Run.")] = None,
) -> None:
    """Take over the lease of a Run whose worker is dead, or of every Run one owner holds.

    Each Run goes back to pending at once (the next tick or `runledger reconcile JOB` runs it)
    and its fence is raised by one: if the worker was not dead after all, its next write (a
    renewal, its raw input, its model call's answer, its output) is refused and it ends
    LeaseLost, so nothing is written twice. Its Attempt ends released, and the Run's error
    says whose lease was taken over.

    Exit status: 0 when released; 2, with one line saying why, for an unknown Run, a Run that
    holds no lease (pending, completed, failed) or an owner that holds none."""
    if (run_id is None) == (owner is None):
        raise fail("give the Run to release (RUN) or the lease owner whose Runs to release "
                   "(--owner OWNER), one of the two", REFUSED_EXIT)
    with open_ledger() as ledger:
        try:
            taken = ledger.take_over(ledger.resolve_run_id(run_id) if run_id else None,
                                     owner=owner)
        except RunledgerError as exc:
            raise fail(exc, REFUSED_EXIT) from None
    out = console()
    for run in taken:
        out.print(f"released {short_id(run.run_id)} {run.job}/{run.subject}/{period_label(run)}:"
                  f" {run.error}; now pending at fence {run.fence}", markup=False,
                  highlight=False)
