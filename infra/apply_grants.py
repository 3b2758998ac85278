"""Apply infra/worker-grants.sql to the ledger database, as its owner (after `runledger db
upgrade`), for the worker role named in it or another one.

    python infra/apply_grants.py [--role NAME] [SQL_FILE]   (RUNLEDGER_DATABASE_URL: the owner)

The compose stack's one-shot setup runs it; elsewhere `psql -f infra/worker-grants.sql` does the
same. The role must exist already (CREATE ROLE ... LOGIN PASSWORD ...)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import sqlalchemy as sa

GRANTS = Path(__file__).resolve().parent / "worker-grants.sql"
ROLE = "runledger_worker"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def grants_sql(role: str = ROLE, path: Path = GRANTS) -> str:
    """The file's statements for ``role`` (a plain lower-case identifier: it is not quoted)."""
    if not _IDENTIFIER.match(role):
        raise ValueError(f"role must be a lower-case SQL identifier, got {role!r}")
    text = path.read_text()
    return re.sub(rf"\b{ROLE}\b", role, text)


def apply_grants(url: str, role: str = ROLE, path: Path = GRANTS) -> None:
    """Run the grants on the database at ``url`` (PostgreSQL) in one transaction."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(grants_sql(role, path))
    finally:
        engine.dispose()


def main(argv: list[str]) -> int:
    role = ROLE
    if "--role" in argv:
        at = argv.index("--role")
        role = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    path = Path(argv[0]) if argv else GRANTS
    url = os.environ.get("RUNLEDGER_DATABASE_URL", "")
    if not url.startswith("postgresql"):
        print("set RUNLEDGER_DATABASE_URL to the ledger's PostgreSQL URL, as its owner",
              file=sys.stderr)
        return 2
    apply_grants(url, role, path)
    print(f"granted {role} what a worker needs ({path.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
