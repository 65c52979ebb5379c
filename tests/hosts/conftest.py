"""Fixtures building a 3-host test lab on its own bridge and subnet; always torn down."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.hosts import LabSpec, create, destroy, setup_ssh, start_daemon, start_sshd, wait_for_port
from tests.hosts.labkit import ECHO_PORT, ECHO_SERVER, HTTP_PORT, lab_spec, require_lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabSpec]:
    require_lab()
    spec = lab_spec(tmp_path_factory.mktemp("lab") / "state")
    destroy(spec)  # a crashed earlier run is swept by name prefix before we start
    try:
        create(spec)
        setup_ssh(spec)
        start_sshd(spec, "consul1")
        addr = str(spec.address("consul1"))
        www = Path(spec.state_dir) / "www"
        www.mkdir(exist_ok=True)
        (www / "index.html").write_text("consul ui\n")
        http = start_daemon(spec, "consul1", "http", [
            sys.executable, "-m", "http.server", str(HTTP_PORT), "--bind", addr, "--directory", str(www),
        ])
        echo = start_daemon(spec, "consul1", "echo", [sys.executable, "-c", ECHO_SERVER, addr, str(ECHO_PORT)])
        wait_for_port(addr, HTTP_PORT, pid=http.pid)
        wait_for_port(addr, ECHO_PORT, pid=echo.pid)
        yield spec
    finally:
        destroy(spec)
