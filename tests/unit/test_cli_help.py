"""`--help` reads as paragraphs at any width: each command list shows a one-line summary whole,
and each command's text is wrapped by the terminal, never at its docstring's line ends."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
import typer
from rich.cells import cell_len
from typer.testing import CliRunner

from flows.cli.app import PANELS, app, paragraphs

WIDTHS = (80, 120)
PANEL_EDGES = "│╭╰"


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group under ``group`` with its path of names (the root's is empty).
    Typed Any: Typer builds them from the click it vendors."""
    yield path, group
    for name, command in group.commands.items():
        if is_group(command):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def is_group(command: Any) -> bool:
    return hasattr(command, "commands")


COMMANDS = list(commands(typer.main.get_command(app)))


def rendered_help(path: tuple[str, ...], width: int) -> list[str]:
    done = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert done.exit_code == 0, done.output
    return done.output.splitlines()


def hard_breaks(lines: list[str], room: int) -> list[str]:
    """Lines of one wrapped paragraph that end before ``room`` cells although the next line's
    first word would have fitted: a line end the text brought, not the terminal."""
    return [line for line, after in pairwise(lines)
            if cell_len(line.strip()) + 1 + cell_len(after.split()[0]) <= room]


def description(lines: list[str]) -> list[list[str]]:
    """The paragraphs of the text between the usage line and the first panel."""
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next((i for i, line in enumerate(lines) if line[:1] in PANEL_EDGES), len(lines))
    found: list[list[str]] = [[]]
    for line in lines[start:end]:
        if line.strip():
            found[-1].append(line)
        elif found[-1]:
            found.append([])
    return [p for p in found if p]


def panel_title(line: str) -> str:
    """The title of the panel whose top edge is ``line`` (``╭─ Run work ───╮``)."""
    return line.strip("╭─╮ ")


def command_rows(lines: list[str]) -> dict[str, list[str]]:
    """The command panels (every panel but Options and Arguments): each command's name with the
    lines of its summary, and the cells its summary column has (up to the panel's right edge
    and its padding)."""
    rows: dict[str, list[str]] = {}
    name = ""
    inside = False
    for line in lines:
        if line[:1] in "╭╰":
            inside = line[:1] == "╭" and panel_title(line) not in ("Options", "Arguments")
            continue
        if not inside:
            continue
        inner = line[1:line.rindex("│")]
        if inner[1:2].strip():
            name = inner.split()[0]
            rows[name] = []
        rows[name].append(inner)
    return rows


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(("path", "command"), [c for c in COMMANDS if is_group(c[1])],
                         ids=lambda v: " ".join(v) or "runledger" if isinstance(v, tuple) else "")
def test_each_command_list_shows_every_summary_whole_and_wrapped_by_the_terminal(
        path: tuple[str, ...], command: Any, width: int) -> None:
    """Each command of a group is listed with its docstring's first paragraph, one sentence
    ending in a full stop, complete, wrapped only where the next word does not fit."""
    rows = command_rows(rendered_help(path, width))
    assert set(rows) == set(command.commands)
    for name, lines in rows.items():
        column = len(lines[0]) - len(lines[0][1:].lstrip(" ")) + 1 + len(name)
        column = lines[0].index(lines[0].split()[1], column)  # where the summaries start
        summary = [line[column:] for line in lines]
        room = len(lines[0]) - column - 1
        expected = command.commands[name].short_help or command.commands[name].help or ""
        assert " ".join(" ".join(summary).split()) == expected, name
        assert "\n" not in expected and expected.endswith("."), name
        assert hard_breaks(summary, room) == [], name


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(("path", "command"), [c for c in COMMANDS if c[0]],
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_each_command_help_wraps_its_paragraphs_at_the_terminal_width(
        path: tuple[str, ...], command: Any, width: int) -> None:
    """A command's `--help` shows its docstring's paragraphs in order, each wrapped by the
    terminal (no line ends early where the next word would fit), none wider than it."""
    lines = rendered_help(path, width)
    shown = description(lines)
    assert [" ".join(" ".join(p).split()) for p in shown] == \
        paragraphs(command.help or "").split("\n\n")
    for paragraph in shown:
        assert hard_breaks(paragraph, width - 2) == [], paragraph
    assert all(cell_len(line) <= width for line in lines)


def test_paragraphs_joins_a_docstrings_lines_and_keeps_its_blank_line_breaks() -> None:
    """The text's own line ends go; a blank line still separates two paragraphs."""
    assert paragraphs("""Summary line.

        First paragraph
        on two lines.

        Second.""") == "Summary line.\n\nFirst paragraph on two lines.\n\nSecond."


@pytest.mark.parametrize(("path", "command"), COMMANDS,
                         ids=lambda v: " ".join(v) or "runledger" if isinstance(v, tuple) else "")
def test_every_command_has_a_help_text_and_its_help_fits_80_columns(
        path: tuple[str, ...], command: Any) -> None:
    """Every command and group, the root included, says what it does, and so does each of its
    parameters; its `--help` at COLUMNS=80 has no line wider than 80 cells."""
    assert (command.help or "").strip(), path
    for param in command.params:
        assert param.name == "help" or (getattr(param, "help", None) or "").strip(), \
            (path, param.name)
    assert [line for line in rendered_help(path, 80) if cell_len(line) > 80] == []


def test_the_command_list_shows_the_panels_of_what_people_do_in_order() -> None:
    """`runledger --help` lists every command in one panel of PANELS (run work, look, operate,
    set up), the panels in that order, each command by name within its panel."""
    root = typer.main.get_command(app)
    lines = rendered_help((), 80)
    titles = [panel_title(line) for line in lines if line[:1] == "╭"]
    assert titles == ["Options", *PANELS]
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        assert command.rich_help_panel in PANELS, name
    shown = list(command_rows(lines))
    assert shown == sorted(root.commands, key=lambda n: (  # type: ignore[attr-defined]
        PANELS.index(root.commands[n].rich_help_panel), n))  # type: ignore[attr-defined]
