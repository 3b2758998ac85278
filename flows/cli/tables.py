"""Tables a person can read at 80 columns: the columns a table is read for are never cut nor
wrapped, free text folds, and low-value columns are left out when the console is too narrow."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

SHORT_ID = 12  # hex characters of a Run or message id in tables; commands take any unique prefix
FOLD = 16  # the narrowest free text folds to before low-value columns are left out instead
EMAIL = 28  # an address folded is hard to read: most are shorter than this


@dataclass(frozen=True)
class Col:
    """One column. ``drop``: 0 keeps it at any width; otherwise the higher it is, the sooner the
    column is left out of a table too wide for the console. ``fold``: 0 never wraps nor cuts
    the values; N > 0 is free text (a subject, a recipient, an error) that may fold onto more
    lines, down to N cells wide. ``optional``: left out when no row has a value (an error
    column on a table without errors)."""

    header: str
    drop: int = 0
    fold: int = 0
    optional: bool = False


def short_id(value: str) -> str:
    return value[:SHORT_ID]


def utc(value: datetime | None) -> str:
    """A timestamp to the second, in UTC (the tables' headers say so), or ``-``."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _widest(text: Text) -> int:
    return max((cell_len(line) for line in text.plain.splitlines()), default=0)


def fit_table(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]], width: int,
              title: str | None = None) -> Table:
    """A table of ``rows`` at most ``width`` cells wide. A plain string cell is shown as it is
    (never read as Rich markup: error texts have brackets); pass Text for a styled one."""
    cells = [[c if isinstance(c, Text) else Text(c) for c in row] for row in rows]
    widest = [max([cell_len(col.header), *(_widest(row[i]) for row in cells)])
              for i, col in enumerate(columns)]
    needs = [min(w, col.fold) if col.fold else w for w, col in zip(widest, columns, strict=True)]
    kept = [i for i, col in enumerate(columns)
            if not (col.optional and not any(row[i].plain for row in cells))]

    def spare(shown: list[int]) -> int:
        # Each column has a cell of padding on either side and one border line on its left;
        # the table has one more on its right.
        return width - sum(needs[i] + 3 for i in shown) - 1

    left_out: list[int] = []
    while spare(kept) < 0 and any(columns[i].drop for i in kept):
        left_out.append(max((i for i in kept if columns[i].drop),
                            key=lambda i: (columns[i].drop, i)))
        kept.remove(left_out[-1])
    # Say what is missing: a reader cannot tell a column left out from one that never existed.
    caption = (f"not shown at {width} columns: "
               f"{', '.join(columns[i].header for i in sorted(left_out))}" if left_out else None)
    if spare(kept) < 0:
        # Even the columns kept at any width do not fit: let every column fold, as wrapped
        # values are still readable where values cut with an ellipsis are not.
        table = Table(title=title, caption=caption)
        for i in kept:
            table.add_column(columns[i].header, overflow="fold")
    else:
        # Folding columns share what the others leave, a cell at a time to whichever lacks the
        # most (Rich would narrow the widest first, folding an address to make room for text).
        sizes = {i: needs[i] for i in kept}
        room = spare(kept)
        while room > 0:
            short = max((i for i in kept if columns[i].fold), default=None,
                        key=lambda i: widest[i] - sizes[i])
            if short is None or sizes[short] >= widest[short]:
                break
            sizes[short] += 1
            room -= 1
        table = Table(title=title, caption=caption)
        for i in kept:
            table.add_column(columns[i].header, overflow="fold", no_wrap=not columns[i].fold,
                             width=sizes[i] if columns[i].fold else None)
    for row in cells:
        table.add_row(*(row[i] for i in kept))
    return table


def print_table(console: Console, columns: Sequence[Col], rows: Sequence[Sequence[str | Text]],
                title: str | None = None) -> None:
    console.print(fit_table(columns, rows, console.width, title))


def decision_text(decision: str | None, by: str | None, at: datetime | None,
                  reason: str | None) -> str:
    """A person's decision on a held message as one line (``approved by alice at ...: why``),
    or ``""`` when nobody decided."""
    if decision is None:
        return ""
    return f"{decision} by {by} at {utc(at)}" + (f": {reason}" if reason else "")
