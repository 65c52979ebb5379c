"""A worker process for durability tests: the real worker plus the test-only actions.

`--stall-once N`: the Nth activity a run schedules holds its workflow task 2.6 s, past the SDK's 2 s deadlock
detector, as a CPU-starved worker would; the worker then runs as production does (run_until_stopped)."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from runtime.connection import connect
from runtime.worker import run_until_stopped
from tests import support

STALL_S = 2.6


class _StallOnce(Interceptor):
    """Holds the workflow task that schedules the `at`th activity (counted across runs) for STALL_S."""

    def __init__(self, at: int) -> None:
        self._at, self._count, self._lock = at, 0, threading.Lock()

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> Any:
        stall = self

        class _Outbound(WorkflowOutboundInterceptor):
            def start_activity(self, input: StartActivityInput) -> Any:
                with stall._lock:
                    stall._count += 1
                    now = stall._count == stall._at
                if now:
                    time.sleep(STALL_S)  # no yield: the deadlock detector interrupts this task
                return super().start_activity(input)

        class _Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(_Outbound(outbound))

        return _Inbound


async def main(address: str, queue: str, stall_once: int | None, grace_s: float) -> None:
    client = await connect(target_host=address, namespace="default")
    if stall_once is None:
        async with support.worker(client, queue):
            print("worker ready", flush=True)
            await asyncio.Event().wait()
        return
    # Unsandboxed, as production runs: the sandbox would import this module afresh for each run.
    worker = support.worker(client, queue, sandboxed=False, interceptors=[_StallOnce(stall_once)])
    await run_until_stopped(worker, asyncio.Event(), grace=timedelta(seconds=grace_s),
                            started=lambda: print("worker ready", flush=True))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("queue")
    parser.add_argument("--stall-once", type=int)
    parser.add_argument("--grace", type=float, default=1.0)
    args = parser.parse_args()
    asyncio.run(main(args.address, args.queue, args.stall_once, args.grace))
