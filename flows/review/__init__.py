"""Review of held outbox messages (issue 49): which messages a decision names, and the
review-outbox flow whose paused run shows them in the Prefect UI with a form to decide."""
