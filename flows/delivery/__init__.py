"""Outbox delivery: the dispatcher that claims due messages, sends them with their stable key and
records each outcome; the retry policy; and the Prefect flow ``deliver-outbox`` around it."""
