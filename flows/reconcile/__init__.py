"""Reconcile: the flow that acts on what every job owes (``flows.occurrences``)."""
