"""A fresh PostgreSQL database per benchmark run, shared by the benchmark scripts."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

POSTGRES = os.environ.get("RUNLEDGER_BENCH_POSTGRES_URL",
                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
# Lets a caller tell its own databases from those of benchmarks running beside it.
PREFIX = os.environ.get("RUNLEDGER_BENCH_DATABASE_PREFIX", "rlbench")


@contextmanager
def postgres_database() -> Iterator[str | None]:
    """The URL of a new empty database, dropped afterwards; None when PostgreSQL is unreachable."""
    admin = sa.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    name = f"{PREFIX}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as exc:
        print(f"PostgreSQL unreachable, skipped: {exc.orig}")
        admin.dispose()
        yield None
        return
    try:
        yield sa.engine.make_url(POSTGRES).set(database=name).render_as_string(False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
