#!/usr/bin/env sh
# The same stack without Docker, from the installed packages: a Prefect server (SQLite, or
# PostgreSQL with PREFECT_API_DATABASE_CONNECTION_URL / a PostgreSQL RUNLEDGER_DATABASE_URL),
# the SMTP sink, and `runledger serve` (or `--workers N` process workers). Ctrl-C stops all.
# Options: see `runledger stack up --help`.
cd "$(dirname "$0")/.." && exec uv run runledger stack up "$@"
