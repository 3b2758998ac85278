"""A runledger job run the way Prefect's own documentation makes a task idempotent, with no ledger.

Each stage (collect, transform, persist) of each subject is a task whose cache key is (job,
version, period, subject, stage); its result is persisted to ``storage`` and its cache record
written under a transaction of isolation level SERIALIZABLE, whose lock a lock manager keeps:
Redis (``prefect-redis``'s ``RedisLockManager``) or the file system (``FileSystemLockManager``).
The persist task validates the candidate and stages the job's messages on its transaction; its
``on_commit`` hook sends them over SMTP before the cache record is written. A rerun of a
completed period finds every stage's record and runs none of them, but still creates one
(cached) task run per stage and subject.

    flow = native_flow(job, model, lock="redis", storage=Path("/tmp/x"), smtp=("127.0.0.1", 2525))
    asyncio.run(flow(period_text="2026-01-01"))

This is the comparison's other side, in ``bench/pipeline_bench.py`` (time) and
``bench/behaviour.py`` (what happens on the failures runledger is built for)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import smtplib
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

from prefect import Flow, flow, task
from prefect.cache_policies import CacheKeyFnPolicy
from prefect.context import SyncClientContext, TaskRunContext
from prefect.filesystems import LocalFileSystem
from prefect.locking.filesystem import FileSystemLockManager
from prefect.locking.protocol import LockManager
from prefect.transactions import Transaction, get_transaction

from bench.call_log import CallLog
from flows.jobs import Job
from flows.model import Model

REDIS = ("127.0.0.1", 6379)
STAGES = ("collect", "transform", "persist")


def lock_manager(kind: str, storage: Path) -> LockManager:
    """The lock manager Prefect's docs pair with SERIALIZABLE: Redis or lock files."""
    if kind == "redis":
        from prefect_redis import RedisLockManager

        # prefect_redis ships no type hints: its RedisLockManager is a LockManager.
        manager: LockManager = RedisLockManager(host=REDIS[0], port=REDIS[1])
        return manager
    if kind == "file":
        return FileSystemLockManager(lock_files_directory=storage / "locks")
    raise ValueError(f"lock must be 'redis' or 'file', got {kind!r}")


def stage_key(job: Job, period_label: str, subject: str, stage: str) -> str:
    """The cache key of one stage of one subject: a digest of (job, version, period, subject,
    stage), safe as a file name for the lock files."""
    identity = "|".join([job.name, job.version, period_label, subject, stage])
    return hashlib.sha256(identity.encode()).hexdigest()


def send(smtp: tuple[str, int], messages: list[dict[str, str]]) -> None:
    """Send ``messages`` over one SMTP connection."""
    with smtplib.SMTP(*smtp, timeout=10) as client:
        for message in messages:
            email = EmailMessage()
            email["From"] = "prefect-native@example.com"
            email["To"] = message["recipient"]
            email["Subject"] = message["subject"]
            email["Message-ID"] = make_msgid(domain="prefect-native.example")
            email.set_content(message["body"])
            client.send_message(email)


def native_flow(job: Job, model: Model, *, lock: str, storage: Path, smtp: tuple[str, int],
                concurrency: int = 8, calls: CallLog | None = None,
                ) -> Flow[[str], Coroutine[Any, Any, int]]:
    """The Prefect-native safe version of ``job``'s tick (see the module's docstring)."""
    manager = lock_manager(lock, storage)
    # Prefect takes a task's result storage only as a block saved on its server.
    results = LocalFileSystem(basepath=str(storage / "results"))
    results.save(f"native-{hashlib.sha256(str(storage).encode()).hexdigest()[:16]}",
                 overwrite=True)

    def stage(name: str) -> dict[str, Any]:
        def key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
            return stage_key(job, parameters["period_label"], parameters["subject"], name)

        policy = CacheKeyFnPolicy(cache_key_fn=key).configure(
            key_storage=storage / "records", lock_manager=manager, isolation_level="SERIALIZABLE")
        return {"name": name, "task_run_name": f"{name}[{{subject}}]", "cache_policy": policy,
                "persist_result": True, "result_storage": results}

    @task(**stage("collect"))
    def collect(subject: str, period_label: str) -> dict[str, Any]:
        return job.collect(subject, job.parse_period(period_label))

    @task(**stage("transform"))
    def transform(subject: str, period_label: str, raw: dict[str, Any]) -> Any:
        if calls is not None:
            calls.record(job.name, subject, period_label)
        return job.transform(raw, model)

    @task(**stage("persist"))
    def persist(subject: str, period_label: str, candidate: Any) -> dict[str, Any]:
        job.validate(candidate)
        output = candidate.output()
        messages = [{"recipient": m.recipient, "subject": m.subject, "body": m.body}
                    for m in job.messages(subject, job.parse_period(period_label), output)]
        transaction = get_transaction()
        assert transaction is not None
        transaction.set("messages", messages)
        return {"output": output, "messages": len(messages)}

    @persist.on_commit
    def deliver(transaction: Transaction) -> None:
        send(smtp, transaction.get("messages"))

    def one(subject: str, period_label: str) -> int:
        raw = collect(subject, period_label)
        done = persist(subject, period_label, transform(subject, period_label, raw))
        return int(done["messages"])

    def fan_out(period_label: str) -> int:
        with SyncClientContext.get_or_create(), \
                ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, s, period_label)
                       for s in job.subject_names()]
            return sum(f.result() for f in futures)

    # Shaped like run_job and the bare flow: an async flow whose sync body runs in a thread.
    @flow(name=f"prefect-native-{lock}", persist_result=False)
    async def native(period_text: str) -> int:
        return await asyncio.to_thread(fan_out, job.parse_period(period_text).label)

    return native
