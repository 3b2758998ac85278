"""What a tick checks before its first model call, so that no money is spent on Runs that
cannot complete: the job's model endpoint is known, and every block its targets name exists
and is usable. What only a Run's output can reveal (an object key, a payload) is checked at
completion."""

from __future__ import annotations

from flows.errors import NotReady
from flows.jobs import InvalidInput, Job
from flows.model import ModelMisconfigured, endpoint_named
from flows.settings import RunledgerSettings
from flows.targets import check_target

NOT_READY_STATE = "NotReady"


def preflight(job: Job, settings: RunledgerSettings, *, sends: bool = True,
              batch: bool = False) -> None:
    """Refuse a tick whose endpoint is unknown (or, for a ``batch`` tick, has no Batch API)
    or, when it ``sends`` messages, whose targets' blocks are missing or invalid
    (``NotReady``, every problem in one line); reads only."""
    problems: list[str] = []
    try:
        endpoint = endpoint_named(job.endpoint, settings)
        if batch:
            endpoint.batch_client().close()
    except (InvalidInput, ModelMisconfigured) as exc:
        problems.append(str(exc))
    for target in job.target_list() if sends else []:
        try:
            check_target(target)
        except InvalidInput as exc:
            problems.append(str(exc).removesuffix(". Nothing was written"))
    if problems:
        raise NotReady(f"job {job.name} is not ready: {'; '.join(problems)}. Nothing was "
                       "written and no model was called")
