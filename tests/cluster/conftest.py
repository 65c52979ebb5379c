"""The production topology under test: Temporal's real server on a private PostgreSQL (runtime/cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cluster import NoToolchain, install
from tests.real import unavailable


@pytest.fixture(scope="session")
def cluster_bin() -> Path:
    """The server and SQL tool, built once per machine (minutes the first time, then cached)."""
    try:
        return install()
    except NoToolchain as exc:
        unavailable(f"{exc}: the real Temporal server is built from source with Go")
