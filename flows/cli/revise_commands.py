"""`runledger runs revise RUN_ID`: a new output for a completed Run, on purpose, through the
revise flow in this process."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from flows.cli.app import runs_app
from flows.cli.flow_runs import run_here
from flows.cli.output import console, fail, open_ledger, print_json
from flows.jobs.schedule import NOT_DUE_FLAG
from flows.run_job.outcomes import outcome_name
from store import InvalidInput, RunledgerError

if TYPE_CHECKING:
    from prefect import State


def parse_params(text: str | None) -> dict[str, Any] | None:
    """--params as a JSON object, or None when not given."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--params must be a JSON object such as "
                           f"'{{\"recipients\": [\"ana@example.com\"]}}': {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"--params must be a JSON object, got {type(value).__name__}")
    return value


@runs_app.command("revise")
def runs_revise(
    run_id: Annotated[str, typer.Argument(
        help="The completed Run to revise: any of its revisions' ids, or a unique prefix "
             "(4+ characters); an unfinished revision's id resumes it.")],
    reason: Annotated[str, typer.Option("--reason", help="Why the output must be redone.")],
    recollect: Annotated[bool, typer.Option(
        "--recollect", help="Collect the input again instead of reusing the stored one.")] = False,
    resend: Annotated[bool, typer.Option(
        "--resend/--no-resend",
        help="Queue the revision's messages (new keys, 'revised' in the subject).")] = True,
    params: Annotated[str | None, typer.Option(
        "--params", help="The revision's parameters as a JSON object (default: the latest "
                         "completed revision's); they must be what the job computes now.")] = None,
    allow_not_due: Annotated[bool, typer.Option(
        NOT_DUE_FLAG, help="Revise a Run of a period not due yet (refused otherwise).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Compute a new output for a completed Run as its next revision.

    The revision is a new Run row linked to the original, computed through the revise flow: the
    original Run and its deliveries stay as they are.

    Uses the Prefect server at PREFECT_API_URL, or a temporary local one. At most one revision
    of a Run is unfinished at a time."""
    from flows.jobs.schedule import require_due
    from flows.registry import get_job, upgrade_ledger

    try:
        if not reason.strip():
            raise InvalidInput("--reason must say why the output is redone, e.g. "
                               "--reason 'recipients changed'")
        new_params = parse_params(params)
        with open_ledger() as ledger:
            upgrade_ledger(ledger)
            full_id = ledger.resolve_run_id(run_id)
            target = ledger.get(full_id)
        job = get_job(target.job)
        require_due(job, job.period_at(target.period_start), datetime.now(UTC),
                    allow_not_due=allow_not_due)
    except RunledgerError as exc:
        raise fail(exc) from None
    from flows.run_job.revision import RevisionReport

    def call() -> Coroutine[Any, Any, State[Any]]:
        from flows.run_job.revision import revise

        return cast("Coroutine[Any, Any, State[Any]]", revise(
            run_id=full_id, reason=reason, recollect=recollect, resend=resend,
            params=new_params, allow_not_due=allow_not_due, return_state=True))

    value, state = run_here(call, RevisionReport, what=f"the revision of run {full_id[:12]}")
    if as_json:
        print_json({**value.as_dict(), "flow_run_id": str(state.state_details.flow_run_id)})
    else:
        console().print(f"{outcome_name(state)}: {value.message}", markup=False,
                        highlight=False)
    if value.outcome == "failed":
        raise typer.Exit(1)
