"""The settle-batches flow: batches polled, settled and their Runs finished (``flow``)."""
