"""Reconcile: what every job owes against the ledger (``plan``), and the flow that acts on it."""

from flows.reconcile.plan import DEFAULT_CAP, Owed, Plan, Step, owed_occurrences, plan

__all__ = ["DEFAULT_CAP", "Owed", "Plan", "Step", "owed_occurrences", "plan"]
