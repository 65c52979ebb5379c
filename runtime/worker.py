"""The coldstart worker: runs RunbookWorkflow and every action in the registry."""

from __future__ import annotations

import asyncio
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import structlog
from temporalio.client import Client
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.catalog import load_registry
from activities.journal import ActionJournal, JournalInterceptor
from activities.registry import Registry
from runtime.connection import connect
from runtime.shedding import JOURNAL_LINES_DROPPED, worker_runtime
from workflows.history_tags import HistoryTagInterceptor
from workflows.fanout import FanOutWorkflow
from workflows.fleet import FleetWorkflow
from workflows.runbook_workflow import RunbookWorkflow

__all__ = ["build_worker", "run_worker"]

log = structlog.get_logger("coldstart.worker")

# Identity tokens are verified inside Update validators: PyJWT and cryptography import submodules
# lazily at verify time, which the sandbox cannot re-import, so they pass through (pure, deterministic).
_SANDBOX = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("jwt", "cryptography"))


def build_worker(
    client: Client,
    queue: str,
    *,
    registry: Registry | None = None,
    executor: ThreadPoolExecutor | None = None,
    max_concurrent_activities: int = 100,
    journal: str | os.PathLike[str] | None = None,
) -> Worker:
    """A worker for the runbook workflows and every registered action (sync ones on a thread pool).

    journal: append a line per action attempt to this file (activities/journal.py)."""
    registry = registry or load_registry()
    interceptors: list[Interceptor] = [HistoryTagInterceptor()]
    if journal:
        mutating = {name: spec.mutating for name, spec in registry.specs.items()}
        interceptors.append(JournalInterceptor(ActionJournal(
            journal, mutating=mutating, on_drop=lambda: JOURNAL_LINES_DROPPED.add("write_failed"))))
    return Worker(
        client,
        task_queue=queue,
        workflows=[RunbookWorkflow, FanOutWorkflow, FleetWorkflow],
        activities=registry.activities(),
        activity_executor=executor or ThreadPoolExecutor(max_workers=max_concurrent_activities),
        max_concurrent_activities=max_concurrent_activities,
        interceptors=interceptors,
        workflow_runner=_SANDBOX,
    )


async def run_worker(queue: str, metrics_address: str | None, journal: str | None = None) -> None:
    """Connect, run until SIGINT or SIGTERM, then finish in-flight tasks."""
    client = await connect(runtime=worker_runtime(metrics_address))
    worker = build_worker(client, queue, journal=journal)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("worker started", task_queue=queue, metrics=metrics_address, actions=len(load_registry().names()),
             journal=journal, pid=os.getpid())
    async with worker:
        await stop.wait()
        log.info("worker stopping: finishing in-flight tasks")
    log.info("worker stopped")
