"""The start of a process with fault points armed, forked from a server that preloaded the
heavy libraries (Prefect among them) but not ``store``, which reads $RUNLEDGER_FAULTS once,
when imported: the environment is set first, as if the process had been started with it."""

from __future__ import annotations

import importlib
import os
import sys

FAULTS = "RUNLEDGER_FAULTS"  # store.faults.ENV, which cannot be imported before it is set
# Imported by the fork server once, so that each forked process starts in a fraction of a second.
PRELOAD = ["sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.postgresql.psycopg",
           "sqlalchemy.dialects.sqlite.pysqlite", "sqlmodel", "psycopg", "pydantic",
           "pydantic_settings", "aiosmtplib", "aiosmtpd.controller", "httpx", "email.parser",
           "prefect", "prefect.flows", "prefect.tasks", "prefect.client.orchestration"]


def run_armed(point: str | None, env: dict[str, str], target: str, *args: str) -> None:
    """Set ``env`` and arm ``point`` (``name`` or ``name@N``; None: nothing armed), then call
    ``target`` ("module:function") with ``args``."""
    assert "store" not in sys.modules, "store was imported before the fault was armed"
    os.environ.update(env)
    os.environ.pop(FAULTS, None)  # whatever the fork server's environment had
    if point is not None:
        os.environ[FAULTS] = point
    module, _, function = target.partition(":")
    getattr(importlib.import_module(module), function)(*args)
