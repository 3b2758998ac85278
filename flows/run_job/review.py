"""A tick of a job with an approval asks for a review: once its Runs held their messages, it
starts a flow run of the review-outbox deployment for its period (once per tick flow run), so
that the reviewer finds a paused form in the Prefect UI. Without that deployment the held
messages wait for `runledger outbox approve`, and the tick says so."""

from __future__ import annotations

import asyncio
import logging

from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from flows.jobs import Job
from store import Ledger, Period

REVIEW_DEPLOYMENT = "review-outbox/review-outbox"  # flow name / deployment name


def held_count(job: Job, period: Period) -> int:
    """How many of the period's messages of ``job`` wait for a decision."""
    with Ledger.open_existing() as ledger:
        return len(ledger.outbox.held(job=job.name, period_start=period.start))


async def ask_for_review(job: Job, period: Period, flow_run_id: str,
                         logger: logging.Logger | logging.LoggerAdapter[logging.Logger]
                         ) -> str | None:
    """Start the review-outbox flow run for the period's held messages of a job with an
    approval; its id, or None when nothing is held or there is no review deployment (logged
    with what to do instead)."""
    if job.approval_now() is None:
        return None
    held = await asyncio.to_thread(held_count, job, period)
    if not held:
        return None
    try:
        found = await run_deployment(  # type: ignore[misc]  # the async dispatch
            REVIEW_DEPLOYMENT, parameters={"job": job.name, "period": period.label},
            timeout=0, idempotency_key=f"review {flow_run_id}", as_subflow=False)
    except ObjectNotFound:
        logger.warning("%d message(s) of %s %s wait for approval; no %s deployment to ask "
                       "for a review: `runledger outbox held`, then approve or reject them",
                       held, job.name, period.label, REVIEW_DEPLOYMENT)
        return None
    except Exception as exc:  # the Runs are completed and their messages held either way
        logger.warning("%d message(s) of %s %s wait for approval; the review flow run could "
                       "not be started (%s): `runledger outbox held`, then approve or reject "
                       "them", held, job.name, period.label, exc)
        return None
    logger.info("%d message(s) wait for approval: review-outbox flow run %s (%s)", held,
                found.name, found.id)
    return str(found.id)
