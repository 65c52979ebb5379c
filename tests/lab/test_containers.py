"""A lab session container: one process, its namespace's PID 1, alone in its cgroup; a graceful stop drains it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import pytest

from lab.containers import ContainerHost, _procs, cgroup_root, session_answers, sessions_cgroup
from tests.real import needs

pytestmark = needs(os.geteuid() == 0 and shutil.which("unshare"), "session containers need root and unshare")


@pytest.fixture
async def host(tmp_path):
    containers = ContainerHost("box", f"t{os.getpid()}", tmp_path, store=None, drain_s=0.3)
    yield containers
    await containers.close()
    base = cgroup_root() / sessions_cgroup(f"t{os.getpid()}")
    for _ in range(100):
        try:
            base.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            await asyncio.sleep(0.05)


async def test_the_cgroup_holds_the_workload_only_and_empties_once_its_init_is_killed(host):
    started = [await host.start(f"r{i}") for i in range(3)]
    assert await host.wait_answering(started, timeout=30) == []
    for container in started:
        # The namespace's PID 1 is the session itself; unshare, its parent, stays outside as a runtime's shim does.
        assert _procs(container.group) == [container.init_pid]
        assert container.proc.pid not in _procs(container.group)
    for container in started:
        os.kill(container.init_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_procs(c.group) for c in started) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert [c.name for c in started if _procs(c.group)] == []
    assert 0 not in [await c.proc.wait() for c in started]  # unshare reports its child killed


async def test_a_graceful_stop_keeps_answering_through_the_drain_then_ends(host):
    container = await host.start("r1")
    assert await host.wait_answering([container], timeout=30) == []
    termed = time.monotonic()
    os.kill(container.init_pid, signal.SIGTERM)
    await asyncio.sleep(0.1)
    assert await session_answers(container.socket)  # draining: still serving
    # It ends by itself (exit 0, not killed), and not before its drain is over (how soon after is a bench's
    # question; the 5 s only keeps a hung session from hanging the test).
    assert await asyncio.wait_for(container.proc.wait(), timeout=5) == 0
    assert time.monotonic() - termed >= host.drain_s
    assert not await session_answers(container.socket)
