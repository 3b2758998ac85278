"""What every command prints through: a console sized for the terminal at the moment it prints,
an error as one line on stderr, JSON on stdout, and the ledger session it reads and writes in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from store import Ledger, RunledgerError


def console(stderr: bool = False) -> Console:
    """A console for the terminal as it is now: made when a command prints, never at import,
    so its width follows the terminal (and COLUMNS) of the command, not of the first import."""
    return Console(stderr=stderr)


def error(problem: BaseException | str, label: str = "error") -> None:
    """Print ``label: problem`` in one line on stderr. The problem's text is escaped: an error
    quoting a subject, a URL or a Python repr has brackets Rich would read as markup."""
    console(stderr=True).print(f"[bold red]{escape(label)}:[/] {escape(str(problem))}",
                               highlight=False, soft_wrap=True)


def fail(problem: BaseException | str, code: int = 1, label: str = "error") -> typer.Exit:
    """Print the problem as ``error`` does and return the exit (status ``code``) to raise: an
    expected error is one clear line, not a traceback."""
    error(problem, label)
    return typer.Exit(code)


def print_json(value: Any) -> None:
    """``value`` as indented JSON with sorted keys on stdout (times and ids as strings)."""
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


@contextmanager
def ledger_session(code: int = 1, label: str = "error", url: str | None = None) -> Iterator[Ledger]:
    """The ledger at ``url`` (default $RUNLEDGER_DATABASE_URL, else ./runledger.db) for one
    ``with`` block, closed when it ends: a runledger error opening it or raised in the block
    ends the command as ``fail`` does, one line on stderr and exit status ``code``."""
    try:
        ledger = Ledger.connect(url)
    except RunledgerError as exc:
        raise fail(exc, code, label) from None
    try:
        yield ledger
    except RunledgerError as exc:
        raise fail(exc, code, label) from None
    finally:
        ledger.close()
