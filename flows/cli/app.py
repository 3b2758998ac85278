"""The `runledger` Typer application; each command group lives in its own module."""

from __future__ import annotations

import inspect
from typing import Any

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from typer import _click  # the click Typer vendors, whose Context its groups take
from typer.core import TyperGroup

from flows.channels import CHANNEL_SETTINGS
from flows.cli.output import error
from flows.delivery.settings import DeliverySettings
from flows.settings import RunledgerSettings, settings_problems
from store import LedgerSettings

# The settings every command reads, checked before any command runs.
SETTINGS: tuple[type[BaseSettings], ...] = (
    RunledgerSettings, LedgerSettings, DeliverySettings, *CHANNEL_SETTINGS)
SETTINGS_ERROR = 2


class Commands(TyperGroup):
    """The command group: a settings error, before or during any command (`check` included),
    is one line per bad variable and exit status 2, never a pydantic traceback."""

    def invoke(self, ctx: _click.Context) -> Any:
        problems: list[str] = []
        for kind in SETTINGS:
            try:
                kind()
            except ValidationError as exc:
                problems += settings_problems(exc)
        try:
            if not problems:
                return super().invoke(ctx)
        except ValidationError as exc:  # a job's own settings, or one read later
            problems = settings_problems(exc)
            if not problems:
                raise
        for problem in problems:
            error(problem)
        raise typer.Exit(SETTINGS_ERROR)


# "rich": help texts may carry Rich markup (none does yet); Typer keeps the line ends of a
# docstring in that mode, which `help_as_paragraphs` removes.
app = typer.Typer(
    name="runledger",
    help="Idempotent scheduled AI jobs on Prefect, with a durable outbox.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
    cls=Commands,
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


def paragraphs(text: str) -> str:
    """``text`` (a docstring) as paragraphs separated by one blank line, each on one line, so
    that the terminal wraps it at its own width rather than at the docstring's line ends."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def help_as_paragraphs(group: typer.Typer) -> None:
    """Give each command of ``group`` and of its sub-groups its docstring as paragraphs for
    ``--help``, and its first paragraph (the docstring's one-line summary) for the command list."""
    for info in group.registered_commands:
        text = paragraphs(info.help or inspect.getdoc(info.callback) or "")
        info.help = text
        info.short_help = info.short_help or text.split("\n\n")[0]
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            help_as_paragraphs(sub.typer_instance)
