"""Backfill: run a job's periods from one date to another on purpose (see ``flow.py``)."""
