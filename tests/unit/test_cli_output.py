"""The CLI's output helpers: errors are one literal line on stderr, consoles take the terminal's
width when they print."""

from __future__ import annotations

import pytest
import typer

from flows.cli.output import console, fail


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
