"""The `runledger` Typer application, its command groups and the help panels that sort their
commands by what a person is doing; the commands live in modules named after what they act on."""

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


# The help panels (`rich_help_panel=`), in the order `--help` shows them; a command names its
# panel where it is declared, and a panel lists its commands by name.
RUN_WORK = "Run work"
LOOK = "Look"
OPERATE = "Operate"
SET_UP = "Set up"
PANELS = (RUN_WORK, LOOK, OPERATE, SET_UP)


class Panels(TyperGroup):
    """A command group whose `--help` shows its panels in the order of PANELS, each with its
    commands sorted by name (commands without a panel first, in Typer's own panel)."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        def place(name: str) -> tuple[int, str]:
            panel = getattr(self.commands[name], "rich_help_panel", None)
            return (PANELS.index(panel) if panel in PANELS else -1, name)

        return sorted(self.commands, key=place)


class Commands(Panels):
    """The root command group: a settings error, before or during any command (`check` included),
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
db_app = typer.Typer(help="Ledger database schema.", no_args_is_help=True, cls=Panels)
runs_app = typer.Typer(help="Look at logical runs, their attempts and outbox rows; requeue, "
                            "release or revise one.", no_args_is_help=True, cls=Panels)
outbox_app = typer.Typer(help="Look at the outbox; approve, reject or requeue its messages.",
                         no_args_is_help=True, cls=Panels)
batches_app = typer.Typer(help="Batches of model calls at the provider's Batch API: settle "
                                "them, look at them.", no_args_is_help=True, cls=Panels)
stack_app = typer.Typer(help="The local stack: Prefect server, SMTP sink, serve or workers.",
                        no_args_is_help=True, cls=Panels)
# Runs and the outbox are where an operator acts on one Run or message (each group splits its
# own commands into Look and Operate).
app.add_typer(batches_app, name="batches", rich_help_panel=RUN_WORK)
app.add_typer(runs_app, name="runs", rich_help_panel=OPERATE)
app.add_typer(outbox_app, name="outbox", rich_help_panel=OPERATE)
app.add_typer(db_app, name="db", rich_help_panel=SET_UP)
app.add_typer(stack_app, name="stack", rich_help_panel=SET_UP)


def check_choice(value: str | None, allowed: tuple[str, ...], what: str) -> None:
    """Refuse an option's ``value`` that is not one of ``allowed`` (None: not given)."""
    if value is not None and value not in allowed:
        raise typer.BadParameter(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


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
