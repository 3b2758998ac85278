"""The ledger's named statements: each has a rule, and the committed SQL files are what the
code compiles to, so a reviewer reading ``store/sql/<dialect>.sql`` reads what is sent."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import store  # noqa: F401  # defines every statement
from store.catalogue import SQL_FILES, engine_dialect, main, named_sql, parameters, sql_text
from store.statement import DIALECTS, STATEMENTS

# A named parameter as each dialect's catalogue prints it, and the placeholder that is sent.
NAMED = {"postgresql": r"%\((\w+)\)s", "sqlite": r"(?<![\w:]):(\w+)"}
SENT = {"postgresql": "%s", "sqlite": "?"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_committed_sql_is_what_the_statements_compile_to(dialect: str) -> None:
    """`python -m store.sql --write` rewrites the file after a statement changes."""
    committed = (SQL_FILES / f"{dialect}.sql").read_text(encoding="utf-8")
    assert committed == sql_text(dialect), f"run `python -m store.sql --write` for {dialect}"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_catalogue_shows_by_name_the_sql_that_is_sent(dialect: str) -> None:
    """Both compile from one build of each statement: the entry with its values kept as
    parameters and its names made positional is the sent SQL, and what the entry writes inline
    is only the statement's own values (each caller-given name is a placeholder still)."""
    for statement in STATEMENTS.values():
        if dialect not in statement.dialects:
            continue
        sent = statement.compiled(engine_dialect(dialect))
        kept = named_sql(statement, dialect, inline=False)
        assert re.sub(NAMED[dialect], lambda _: SENT[dialect], kept) == sent.sql, statement.name
        shown = named_sql(statement, dialect)
        given = [n for n in sent.order or () if n not in sent.defaults]
        assert re.findall(NAMED[dialect], shown) == given, statement.name
        assert parameters(statement, dialect) == tuple(dict.fromkeys(re.findall(NAMED[dialect], shown)))


def test_every_statement_has_a_name_and_a_one_sentence_rule() -> None:
    """A rule is what a reviewer checks the SQL against: present and ending as a sentence."""
    assert len(STATEMENTS) >= 30
    for name, statement in STATEMENTS.items():
        assert statement.name == name and name.isidentifier()
        assert statement.rule.strip().endswith("."), name
        assert set(statement.dialects) <= set(DIALECTS), name


def test_the_sql_check_fails_on_a_stale_file_until_it_is_rewritten(tmp_path: Path) -> None:
    """`python -m store.sql` exits 1 naming the stale file; `--write` makes it current."""
    for dialect in DIALECTS:
        (tmp_path / f"{dialect}.sql").write_text(sql_text(dialect), encoding="utf-8")
    stale = tmp_path / "sqlite.sql"
    stale.write_text(stale.read_text(encoding="utf-8").replace("BEGIN IMMEDIATE", "BEGIN"),
                     encoding="utf-8")
    assert main([], files=tmp_path) == 1
    assert main(["--write"], files=tmp_path) == 0
    assert main([], files=tmp_path) == 0


def test_the_sql_command_passes_on_the_committed_files() -> None:
    """The module command CI and developers run: exit 0 on a clean checkout."""
    done = subprocess.run([sys.executable, "-m", "store.sql"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
