#!/bin/sh
# The workers' login role, made on the first start of the PostgreSQL container (an empty
# volume). It owns nothing: the compose setup gives it infra/worker-grants.sql's grants after
# each `runledger db upgrade`. The password comes from WORKER_DB_PASSWORD (infra/.env).
set -eu
psql -v ON_ERROR_STOP=1 -v password="$WORKER_DB_PASSWORD" \
    --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE runledger_worker LOGIN PASSWORD :'password';
SQL
