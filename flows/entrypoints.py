"""The flows a deployment names, under one stable module path.

A deployment's entrypoint is ``flows.entrypoints.<flow>`` (Prefect's dotted form, resolved by
import): it works for ``prefect deploy``, ``runledger serve`` and workers in any folder where
runledger is installed, which a file path (``flows/....py:flow``) does not outside a checkout."""

from flows.backfill.flow import backfill
from flows.delivery.flow import deliver_outbox
from flows.reconcile.flow import reconcile
from flows.retention import prune
from flows.review.flow import review_outbox
from flows.run_job.flow import run_job
from flows.run_job.revision import revise
from flows.settle.flow import settle_batches

__all__ = ["backfill", "deliver_outbox", "prune", "reconcile", "review_outbox", "revise",
           "run_job", "settle_batches"]
