"""Test seams: a registry with test-only actions, a scripted Prometheus API, and run helpers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError

from activities.binding import action
from activities.catalog import load_registry
from activities.registry import Registry
from activities.retry import Retry
from cli.identity import DecisionSource, start_source
from runtime.catalog import Catalog
from runtime.runs import start_run, workflow_id_for
from runtime.worker import build_worker
from workflows.contract import RunRequest
from workflows.loader import plan_run

test_registry = Registry()


class AppendInput(BaseModel):
    path: str
    label: str


class AppendOutput(BaseModel):
    line: str


@action("test.append", registry=test_registry, mutating=True, undo="test.append_undo", retry=Retry(max_attempts=1))
def append(inp: AppendInput) -> AppendOutput:
    """Append one line per execution (deliberately not idempotent: it counts executions)."""
    info = activity.info()
    line = f"{info.workflow_id} {inp.label}"
    with open(inp.path, "a") as handle:
        handle.write(line + "\n")
    return AppendOutput(line=line)


@action("test.append_undo", registry=test_registry, mutating=True, retry=Retry(max_attempts=1))
def append_undo(inp: AppendInput) -> AppendOutput:
    """Record an undo, so tests can see rollback order."""
    with open(inp.path, "a") as handle:
        handle.write(f"undo {inp.label}\n")
    return AppendOutput(line=f"undo {inp.label}")


class FailInput(BaseModel):
    path: str
    label: str
    fail_until_file_exists: str | None = None
    fail_items: list[str] = []


@action("test.maybe_fail", registry=test_registry, mutating=True, retry=Retry(max_attempts=1))
def maybe_fail(inp: FailInput) -> AppendOutput:
    """Fail while a flag file is absent, or when the label is listed in fail_items."""
    if inp.label in inp.fail_items or (inp.fail_until_file_exists and not os.path.exists(inp.fail_until_file_exists)):
        raise ApplicationError(f"injected failure for {inp.label}", non_retryable=True)
    with open(inp.path, "a") as handle:
        handle.write(f"{inp.label}\n")
    return AppendOutput(line=inp.label)


class SlowInput(BaseModel):
    path: str
    label: str
    seconds: float = 4.0


@action("test.slow_append", registry=test_registry, mutating=True, heartbeat=2, retry=Retry(max_attempts=3))
def slow_append(inp: SlowInput) -> AppendOutput:
    """Append `started <label> <attempt>` at each attempt's start, heartbeat its progress every 0.2 s for
    `seconds` (a retried attempt resumes from the last heartbeat), then append `<label>` once it is done."""
    info = activity.info()
    with open(inp.path, "a") as handle:
        handle.write(f"started {inp.label} {info.attempt}\n")
    done = float(info.heartbeat_details[0]) if info.heartbeat_details else 0.0
    while done < inp.seconds:
        time.sleep(0.2)
        done += 0.2
        activity.heartbeat(done)
    with open(inp.path, "a") as handle:
        handle.write(f"{info.workflow_id} {inp.label}\n")
    return AppendOutput(line=inp.label)


def registry() -> Registry:
    return load_registry().merged(test_registry)


class ScriptedPrometheus:
    """Serves /api/v1/query with the shapes of the Prometheus HTTP API, from a script of values per query."""

    def __init__(self) -> None:
        self.values: dict[str, list[float | None]] = {}
        self.default: float | None = 1.0
        self.down = False
        self.calls: list[str] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    def script(self, query: str, *values: float | None) -> None:
        self.values[query] = list(values)

    async def _query(self, request: web.Request) -> web.Response:
        if self.down:
            return web.Response(status=503, text="down")
        query = request.query.get("query", "")
        self.calls.append(query)
        queue = self.values.get(query)
        value = queue.pop(0) if queue and len(queue) > 1 else (queue[0] if queue else self.default)
        result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    async def start(self) -> ScriptedPrometheus:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()


def write_runbook(tmp_path: Path, body: str, name: str = "test") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(body))
    return path


async def start(client: Client, file: Path, task_queue: str, *, target: dict[str, Any] | None = None,
                initiator: str = "tester", params: dict[str, Any] | None = None, reg: Registry | None = None,
                identity: Callable[[DecisionSource], str] | None = None) -> WorkflowHandle:
    """Plan and start a run; `identity` fetches the starter's token from the run's start source (verified start)."""
    run = plan_run(file, registry=reg or registry(), params=params,
                   inventory=target or {"name": f"t-{task_queue}"}, initiator=initiator)
    source = start_source(run, workflow_id_for(run.target_name)) if identity is not None else None
    token = identity(source) if identity is not None and source is not None else None
    return await start_run(client, run, task_queue, identity_token=token)


class PlannedTargets(Catalog):
    """The tests' catalog: the repository's runbooks, and each test's own target as a development target with
    the inventory the test planned against (made with allow_development, as the tests' worker is). A test seam
    only: a production catalog never takes a target from the starter (tests/test_catalog.py runs the real
    Catalog's refusals)."""

    def target(self, request: RunRequest) -> tuple[dict[str, Any], bool]:
        return request.inventory, self.allow_development


CATALOG = PlannedTargets(Path(__file__).resolve().parents[1] / "runbooks", None, allow_development=True)


def development_target(targets: Path, name: str) -> dict[str, Any]:
    """Write targets/NAME.yaml, a development target (it runs a test's own runbooks), for a worker started as
    production starts it (its catalog from $COLDSTART_TARGETS), with --allow-development; returns the inventory
    to plan against."""
    inventory = {"name": name, "development": True, "telemetry": {"prometheus": "http://127.0.0.1:9"}}
    targets.mkdir(parents=True, exist_ok=True)
    (targets / f"{name}.yaml").write_text(json.dumps(inventory))
    return inventory


def worker(client: Client, task_queue: str, **options: Any):
    """The controller's worker with the test actions, its runs in Temporal's sandbox: production runs them
    unsandboxed (runtime/worker.py), so the tests are where a non-deterministic call fails a run. Development
    targets are allowed (the tests run their own runbooks); a test giving a catalog gives its setting too."""
    options.setdefault("sandboxed", True)
    options.setdefault("catalog", CATALOG)
    options.setdefault("allow_development", options["catalog"].allow_development)
    return build_worker(client, task_queue, registry=registry(), executor=ThreadPoolExecutor(16), max_concurrent_activities=16,
                        **options)


def spawn_worker(address: str, queue: str, env: dict[str, str] | None = None,
                 args: Sequence[str] = ()) -> subprocess.Popen:
    """tests/worker_process.py (the real worker plus the test actions) in its own process group, so a
    test can SIGKILL it; returns once it polls. env: extra variables (an envconfig profile); args: its options."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.worker_process", address, queue, *args],
        cwd=Path(__file__).resolve().parents[1], env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert "worker ready" in line, line
    return process


async def wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.1):
    """Poll an async predicate until it returns truthy; returns its value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


async def status(handle: WorkflowHandle):
    from workflows.contract import RunStatus

    return await handle.query("status", result_type=RunStatus)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


_ = json


def step_timers(history) -> list:
    """The run's TimerStarted events but the live view's own (workflows/visibility.VIEW_EVERY's pacing)."""
    from temporalio.api.enums.v1 import EventType

    from workflows.history_tags import VIEW_TIMER_SUMMARY

    return [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
            and VIEW_TIMER_SUMMARY.encode() not in e.user_metadata.summary.data]
