"""The `runledger` Typer application; each command group lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="runledger",
    help="Idempotent scheduled AI jobs on Prefect, with a durable outbox.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
db_app = typer.Typer(help="Ledger database schema.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect logical runs, their attempts and outbox rows.", no_args_is_help=True)
outbox_app = typer.Typer(help="Inspect and operate the outbox.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(outbox_app, name="outbox")


def api_refused(error: BaseException) -> str | None:
    """One line for the Prefect API refusing our credentials (401/403), None for any other
    error. It names the variable to set, never its value."""
    from prefect.exceptions import PrefectHTTPStatusError

    if not isinstance(error, PrefectHTTPStatusError) or error.response.status_code not in (401, 403):
        return None
    status = error.response.status_code
    url = str(error.request.url).split("/api/", 1)[0] + "/api"
    return (f"the Prefect server at {url} refused the request ({status} "
            f"{'Unauthorized' if status == 401 else 'Forbidden'}): set PREFECT_API_AUTH_STRING "
            "to its user:password (the server's PREFECT_SERVER_API_AUTH_STRING; "
            "docs/security.md)")
