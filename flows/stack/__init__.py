"""The local stack without Docker: a Prefect server, the SMTP sink, `runledger serve` or
process workers, started and stopped as one (`runledger stack up`)."""
