"""The run-job flow with the throughput benchmark's job registered (named by BENCH_JOB, of
BENCH_SUBJECTS subjects): the entrypoint of the deployment whose work pool runs the shards of
``bench/throughput.py``'s multi-process contender (``bench.volume_flow.run_job``)."""

from __future__ import annotations

import os

from bench.volume_tick import volume_job
from flows.registry import register
from flows.run_job.flow import run_job

register(volume_job(os.environ["BENCH_JOB"], int(os.environ["BENCH_SUBJECTS"])))

__all__ = ["run_job"]
