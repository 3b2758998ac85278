"""`runledger db upgrade`: create or migrate the ledger schema and the jobs' own tables."""

from __future__ import annotations

import typer

from flows.cli.app import db_app
from flows.cli.output import console, ledger_session


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Alembic revision to upgrade to.")) -> None:
    """Create or migrate the ledger schema and the registered jobs' tables.

    Runs Alembic's upgrade to REVISION, then creates the registered jobs' own business tables
    that are missing. Run it before the workers of a new version start."""
    from flows.registry import upgrade_ledger

    with ledger_session() as ledger:
        with_tables = upgrade_ledger(ledger, revision)
    tables = f"; tables of {', '.join(with_tables)}" if with_tables else ""
    console().print(f"ledger schema at {revision} ({ledger.dialect}){tables}")
