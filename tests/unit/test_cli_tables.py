"""The CLI's tables at 80 columns: the columns a table is read for are never cut nor wrapped,
low-value columns are left out first, free text folds, and nothing is cut with an ellipsis."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

from rich.console import Console
from rich.text import Text

from flows.cli.runs_commands import RUN_COLUMNS
from flows.cli.tables import FOLD, Col, fit_table, short_id, utc

RUN_ID = "d4baf766fcbfd7cb6ec98a67bf4ffc791a7a2ab6782994023ea1976848b8fec0"
RUN_ROW: list[str | Text] = [short_id(RUN_ID), "competitor-summary", "acme", "2026-12-01", "1",
                             "0", "completed", "1"]


def render(columns: list[Col], rows: list[list[str | Text]], width: int = 80) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(fit_table(columns, rows, console.width))
    output = console.file.getvalue()  # type: ignore[attr-defined]
    return str(output).splitlines()


def line_with(lines: list[str], value: str) -> str:
    return next(line for line in lines if value in line)


def test_a_run_row_at_80_columns_keeps_job_period_and_short_id_whole_on_one_line() -> None:
    """Run id (12 characters), job and period are on one line, whole, and no line is wider
    than 80 or has an ellipsis; attempts, version and revision are left out to make room, and
    the caption names them."""
    lines = render(RUN_COLUMNS, [RUN_ROW, [short_id("8c91062d1074" + "0" * 52),
                                           "competitor-summary", "globex", "2026-12-01", "1",
                                           "1", "pending", "0"]])
    row = line_with(lines, "d4baf766fcbf")
    assert "competitor-summary" in row and "2026-12-01" in row and "completed" in row
    assert "d4baf766fcbfd" not in row
    assert all(len(line) <= 80 and "…" not in line for line in lines)
    assert "attempts" not in lines[1] and "version" not in lines[1]
    assert " ".join(lines[-1].split()) == "not shown at 80 columns: version, rev, attempts"


def test_a_wide_console_shows_every_column() -> None:
    """At 120 columns nothing is left out."""
    lines = render(RUN_COLUMNS, [RUN_ROW], width=120)
    assert all(col.header in lines[1] for col in RUN_COLUMNS)
    assert not any("not shown" in line for line in lines)


def test_the_highest_drop_goes_first() -> None:
    """Revision (drop 3) and attempts (drop 2) are left out before version (drop 1)."""
    header = render(RUN_COLUMNS, [RUN_ROW], width=88)[1]
    assert "version" in header and "attempts" not in header and "rev" not in header


def test_free_text_folds_whole_where_a_long_error_would_be_cut() -> None:
    """A long error folds onto more lines; every word of it is shown, none cut."""
    error = ("lease-lost: leased by host-7:4242:flow-run/task-run until 2026-12-01 09:00:00, "
             "[Errno -2] Name or service not known")
    columns = [Col("subject", fold=FOLD), Col("outcome"), Col("run id"),
               Col("attempts", drop=1), Col("error", fold=FOLD)]
    lines = render(columns, [["acme", "failed", short_id(RUN_ID), "3", error]])
    text = " ".join(line.strip("│ ") for line in lines)
    assert all(word in text for word in error.split())
    assert all(len(line) <= 80 and "…" not in line for line in lines)


def test_plain_cells_are_not_read_as_markup_and_text_keeps_its_style() -> None:
    """'[Errno -2]' is shown as typed; a Text cell keeps its style and costs no width."""
    console = Console(width=80, file=io.StringIO(), color_system="standard")
    table = fit_table([Col("outcome"), Col("error", fold=FOLD)],
                      [[Text("failed", style="bold red"), "[Errno -2] [bold]x[/]"]], 80)
    console.print(table)
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[Errno -2] [bold]x[/]" in output and "\x1b[1;31mfailed" in output


def test_an_optional_column_without_values_is_left_out() -> None:
    """No row has an error: no error column."""
    columns = [Col("subject"), Col("error", fold=FOLD, optional=True)]
    assert "error" not in render(columns, [["acme", ""]])[1]
    assert "error" in render(columns, [["acme", "boom"]])[1]


def test_a_console_too_narrow_for_the_kept_columns_wraps_rather_than_cuts() -> None:
    """At 40 columns the values wrap; none is cut with an ellipsis."""
    lines = render(RUN_COLUMNS, [RUN_ROW], width=40)
    assert all(len(line) <= 40 and "…" not in line for line in lines)
    job_column = "".join(line.split("│")[2].strip() for line in lines if line.startswith("│"))
    assert job_column == "competitor-summary"


def test_timestamps_are_shown_to_the_second_in_utc() -> None:
    """A timestamp is UTC to the second, and a missing one a dash."""
    local = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert (utc(local), utc(None)) == ("2026-12-01 08:30:15", "-")
