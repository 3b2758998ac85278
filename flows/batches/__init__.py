"""Batches: a batch tick's queued model calls sent through the provider's Batch API, and the
settling of what each batch answered (``submit``: open a batch and create it at its provider
once; ``settle``: a result line as the ledger records it; ``poll``: move each due batch on).
The settle-batches flow (``flows.settle``) polls and runs the released Runs again."""
