"""The CLI's output helpers: errors are one literal line on stderr, consoles take the terminal's
width when they print, a ledger session closes its ledger and ends a command on a runledger
error."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from flows.cli.output import console, fail, ledger_session
from store import Ledger, RunledgerError


class FakeLedger:
    """Stands for a Ledger: remembers the URL it was opened with and whether it was closed."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ledgers `ledger_session` opens, without a database."""
    ledgers: list[Any] = []

    def connect(url: str | None = None) -> Any:
        ledgers.append(FakeLedger(url))
        return ledgers[-1]

    monkeypatch.setattr(Ledger, "connect", staticmethod(connect))
    return ledgers


def test_an_error_quoting_rich_markup_is_printed_literally_on_stderr(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Brackets in an error's text (a repr, a subject) are shown as they are, not read as
    markup; the exit carries the status asked for."""
    exit_ = fail(ValueError("no job [bold]acme[/] in [red]"), code=2)
    captured = capsys.readouterr()
    assert isinstance(exit_, typer.Exit) and exit_.exit_code == 2
    assert captured.out == ""
    assert captured.err.strip() == "error: no job [bold]acme[/] in [red]"


def test_a_console_takes_the_width_the_terminal_has_when_it_is_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """COLUMNS changed after import still sizes the next console (no width fixed at import)."""
    monkeypatch.setenv("COLUMNS", "97")
    assert console().width == 97
    monkeypatch.setenv("COLUMNS", "131")
    assert console(stderr=True).width == 131


def test_a_ledger_session_opens_the_ledger_at_the_url_given_and_closes_it(
        opened: list[Any]) -> None:
    """The block gets the ledger at the URL asked for (default: the settings'), closed after."""
    with ledger_session(url="sqlite:///x.db") as ledger:
        assert opened == [ledger] and not opened[0].closed
    fake: FakeLedger = opened[0]
    assert fake.url == "sqlite:///x.db" and fake.closed


def test_a_runledger_error_in_a_ledger_session_ends_the_command_with_one_line_and_its_status(
        opened: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    """A runledger error raised in the block is one line on stderr and the exit status given;
    the ledger is closed all the same."""
    with pytest.raises(typer.Exit) as ended, ledger_session(2):
        raise RunledgerError("no Run with id 'abcd'")
    assert ended.value.exit_code == 2
    assert capsys.readouterr().err.strip() == "error: no Run with id 'abcd'"
    assert opened[0].closed


def test_a_ledger_session_lets_any_other_error_through_and_still_closes_the_ledger(
        opened: list[Any]) -> None:
    """Only runledger errors are the CLI's one-line messages; a bug stays a traceback."""
    with pytest.raises(KeyError), ledger_session():
        raise KeyError("bug")
    assert opened[0].closed
