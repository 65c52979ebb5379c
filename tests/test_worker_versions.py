"""Workers as Worker Deployment versions on the real dev server: a run finishes on the build it started on.

Two builds of the worker ("A" and "B") poll one task queue as versions of one deployment (runtime/deployment.py).
A run started while A is current waits on a timer while B is promoted; every workflow task of that run and of
its fan-out children is then completed by A (their histories say so), while a run started after the promotion
runs on B. With A stopped, B never takes A's pinned run: its timer fires, the workflow task waits, and the run
goes on only when a worker of A is back.
"""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import EventType, VersioningBehavior
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkerDeploymentVersion

from runtime.deployment import current_build_id, describe_versions, promote, take_place
from runtime.queues import deployment_name
from tests import support
from workflows.contract import RunResult
from workflows.fanout import FANOUT_CHILD_THRESHOLD

# Enough items that the for_each runs them in fan-out children, each a workflow pinned like its run.
ITEMS = [f"i{n}" for n in range(FANOUT_CHILD_THRESHOLD + 1)]


def _book(tmp_path, out, wait: str):
    return support.write_runbook(tmp_path, f"""
        metadata: {{name: versions}}
        target: t
        params:
          items: {{type: list, default: {ITEMS}}}
        steps:
          - id: first
            action: test.append
            with: {{path: "{out}", label: first}}
          - id: bake
            wait: {wait}
          - id: each
            for_each:
              items: ${{{{ params.items }}}}
              as: item
              action: test.append
              with: {{path: "{out}", label: "${{{{ item }}}}"}}
    """)


async def _builds(client: Client, handle: WorkflowHandle) -> dict[str, set[str]]:
    """Each workflow of the run (the run, then its children): the build ids that completed its workflow tasks,
    each task completed as PINNED."""
    builds: dict[str, set[str]] = {}
    todo = [handle]
    while todo:
        current = todo.pop()
        seen = builds.setdefault(current.id, set())
        async for event in current.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                completed = event.workflow_task_completed_event_attributes
                assert completed.versioning_behavior == VersioningBehavior.VERSIONING_BEHAVIOR_PINNED, completed
                seen.add(completed.deployment_version.build_id)
            elif event.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                child = event.child_workflow_execution_started_event_attributes.workflow_execution
                todo.append(client.get_workflow_handle(child.workflow_id, run_id=child.run_id))
    return builds


async def _in_bake(handle: WorkflowHandle) -> None:
    async def baking():
        status = await support.status(handle)
        return any(s.id == "bake" and s.status == "running" for s in status.steps)

    await support.wait_for(baking)


async def test_a_run_finishes_on_the_build_it_started_on_and_new_runs_take_the_promoted_one(env, task_queue, tmp_path):
    client = env.client
    name = deployment_name(task_queue)
    a, b = WorkerDeploymentVersion(name, "0.1.0+actions-a"), WorkerDeploymentVersion(name, "0.1.0+actions-b")
    book = _book(tmp_path, tmp_path / "out.txt", "4s")
    async with support.worker(client, task_queue, deployment=a):
        # The deployment's first version becomes current on its worker's start.
        assert (await take_place(client, a, make_current=False, identity="test")).current
        old = await support.start(client, book, task_queue, target={"name": "old"})
        await _in_bake(old)
        async with support.worker(client, task_queue, deployment=b):
            place = await take_place(client, b, make_current=False, identity="test")
            assert not place.current and place.other == a.build_id  # a second build waits to be promoted
            assert await promote(client, b, identity="test") == a.build_id
            assert await current_build_id(client, name) == b.build_id
            new = await support.start(client, book, task_queue, target={"name": "new"})
            results = await asyncio.gather(old.result(), new.result())
    assert all(isinstance(r, RunResult) and r.state == "succeeded" for r in results)
    old_builds, new_builds = await _builds(client, old), await _builds(client, new)
    # The run and each of its fan-out batches: every workflow task completed by A, even after B was current.
    assert len(old_builds) > 1 and all(seen == {a.build_id} for seen in old_builds.values()), old_builds
    assert len(new_builds) > 1 and all(seen == {b.build_id} for seen in new_builds.values()), new_builds
    versions = {v.build_id: v for v in await describe_versions(client, name)}
    assert versions[b.build_id].current and not versions[a.build_id].current


async def test_a_worker_of_the_new_build_alone_never_takes_the_old_builds_run(env, task_queue, tmp_path):
    client = env.client
    name = deployment_name(task_queue)
    a, b = WorkerDeploymentVersion(name, "0.1.0+actions-a"), WorkerDeploymentVersion(name, "0.1.0+actions-b")
    out = tmp_path / "out.txt"
    book = _book(tmp_path, out, "1s")
    async with support.worker(client, task_queue, deployment=a):
        await take_place(client, a, make_current=False, identity="test")
        old = await support.start(client, book, task_queue, target={"name": "old"})
        await _in_bake(old)
    async with support.worker(client, task_queue, deployment=b):
        await promote(client, b, identity="test")
        # The bake's timer fires with only B polling: the task it makes is A's, and waits for A.
        await asyncio.sleep(4)
        events = [e async for e in old.fetch_history_events()]
        fired = next(i for i, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED)
        after = [e.event_type for e in events[fired + 1:]]
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED in after, after
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED not in after, after
        assert support.lines(out) == [support.lines(out)[0]]  # only the first step ran
        async with support.worker(client, task_queue, deployment=a):
            result = await old.result()
    assert isinstance(result, RunResult) and result.state == "succeeded"
    assert all(seen == {a.build_id} for seen in (await _builds(client, old)).values())
    assert len(support.lines(out)) == 1 + len(ITEMS)


def test_coldstart_worker_polls_as_a_version_that_promote_and_versions_steer(env, task_queue, tmp_path):
    """The product's path: `coldstart worker` starts as its installation's version and, first in its deployment,
    is current; `coldstart worker versions` lists it; promoting a build no worker runs fails and says why."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from activities.catalog import load_registry
    from runtime.deployment import deployment_build_id

    coldstart = [sys.executable, "-m", "cli.main"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*coldstart, "worker", *args], cwd=repo, env=environ, capture_output=True, text=True,
                              timeout=60, check=False)
    environ = {**os.environ, "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
               "TEMPORAL_NAMESPACE": env.client.namespace, "COLDSTART_SEAL_KEYS": str(tmp_path / "seal-keys"),
               "COLDSTART_TASK_QUEUE": task_queue}
    repo = Path(__file__).resolve().parents[1]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([*coldstart, "worker", "--metrics", ""], cwd=repo, env=environ, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "worker started" not in log.read_text() and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.2)
        started = next(json.loads(line) for line in log.read_text().splitlines() if "worker started" in line)
        build_id = deployment_build_id(load_registry())
        assert (started["deployment"], started["build_id"], started["version"]) == (
            deployment_name(task_queue), build_id, "current"), started
        # Every namespace of the default catalog loaded (the base install's too: tests/test_wheel_install.py).
        assert set(started["namespaces"]) >= {"cache", "consul", "dns", "firewall", "nomad", "telemetry", "vault"}

        versions = cli("versions")
        assert versions.returncode == 0 and versions.stdout.split() == ["*", build_id, "current"], versions

        absent = cli("promote", "--build-id", "9.9.9+actions-none", "--within", "1")
        assert absent.returncode == 1 and "9.9.9+actions-none not made current" in absent.stderr, absent
        again = cli("promote")
        assert again.returncode == 0 and again.stdout == f"{deployment_name(task_queue)}: {build_id} was already current\n", again
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
