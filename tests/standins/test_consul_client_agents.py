"""The Consul stand-in's client agents: their streaming setting from their config directory, applied on SIGHUP,
and the streaming load only while a client still streams (as on the real agents, not a KV flag alone)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from lab.standins.clock import FakeClock
from lab.standins.consul import read_agent_config
from lab.standins.consul_load import LoadParams
from tests.standins.conftest import start_consul, wait_until

REPO = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_client_reads_its_config_dir_in_name_order(tmp_path) -> None:
    assert read_agent_config(tmp_path / "absent") == {"use_streaming_backend": True}  # Consul's default
    (tmp_path / "10-base.json").write_text(json.dumps({"use_streaming_backend": True}))
    (tmp_path / "coldstart-streaming.json").write_text(json.dumps({"use_streaming_backend": False}))
    (tmp_path / "zz-broken.json").write_text("{not json")
    assert read_agent_config(tmp_path) == {"use_streaming_backend": False}


def test_streaming_load_needs_a_client_that_streams() -> None:
    lab = start_consul(FakeClock(), LoadParams(rate_window_s=1.0))
    try:
        cluster = lab.cluster
        cluster.fault_contention()
        assert cluster.streaming()
        cluster.client_streaming = {"edge": True, "internal": False}
        assert cluster.streaming()
        cluster.client_streaming = {"edge": False, "internal": False}
        assert not cluster.streaming()  # the fault's flag alone no longer makes streaming load
    finally:
        lab.server.stop()


def test_a_reload_applies_the_config_dir_and_agent_self_reports_it(tmp_path) -> None:
    server_port, client_port = _port(), _port()
    config_dir = tmp_path / "edge"
    config_dir.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "lab.standins", "consul", "--listen", f"127.0.0.1:{server_port}",
         "--client", f"edge={config_dir}@127.0.0.1:{client_port}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        url = f"http://127.0.0.1:{client_port}/v1/agent/self"

        def reported():
            try:
                return httpx.get(url, timeout=1).json()
            except httpx.HTTPError:
                return None

        first = wait_until(reported)
        assert first["Config"]["Server"] is False and first["Config"]["NodeName"] == "edge"
        assert first["DebugConfig"]["UseStreamingBackend"] is True
        (config_dir / "coldstart-streaming.json").write_text(json.dumps({"use_streaming_backend": False}))
        assert reported()["DebugConfig"]["UseStreamingBackend"] is True  # a file alone changes nothing
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: reported()["DebugConfig"]["UseStreamingBackend"] is False)
    finally:
        process.terminate()
        process.wait(timeout=10)
