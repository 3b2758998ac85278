-- Prefect's own database next to the ledger's (`runledger`, created by POSTGRES_DB).
CREATE DATABASE prefect OWNER runledger;
