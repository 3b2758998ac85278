"""The start of a process with fault points armed, forked from a server that preloaded the
heavy libraries but not ``store``, which reads $RUNLEDGER_FAULTS once, when imported: the
variable is set first, as if the process had been started with it."""

from __future__ import annotations

import os
import sys

FAULTS = "RUNLEDGER_FAULTS"  # store.faults.ENV, which cannot be imported before it is set
# Imported by the fork server once, so that each forked process starts in milliseconds.
PRELOAD = ["sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.postgresql.psycopg",
           "sqlalchemy.dialects.sqlite.pysqlite", "sqlmodel", "psycopg", "pydantic",
           "pydantic_settings", "aiosmtplib", "aiosmtpd.controller", "httpx", "email.parser"]


def walk_armed(point: str, *args: str) -> None:
    """Arm ``point``, then walk (``fault_walk.main``): the process dies there."""
    assert "store" not in sys.modules, "store was imported before the fault was armed"
    os.environ[FAULTS] = point
    from tests.integration.fault_walk import main

    main(list(args))
