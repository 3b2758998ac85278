"""What a job owes: its occurrences and where each stands (``plan``), from one ledger read
(``prepare``); shared by reconcile, the status board and the events, below all three."""
