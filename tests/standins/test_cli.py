"""`python -m lab.standins ...` as subprocesses: loopback multi-server listeners, and netns listeners when root."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

import consul
import nomad
import pytest
import requests

from lab.standins.clock import FakeClock
from lab.standins.inproc import InProcServer, free_socket
from lab.standins.nomad import make_app as nomad_app
from lab.standins.nomad import parse_node
from lab.standins.nomad_state import NomadState
from runtime.processes import free_port
from tests.real import needs

from .conftest import wait_until

REPO = Path(__file__).resolve().parents[2]
_netns = needs(os.geteuid() == 0 and shutil.which("ip"), "needs root and iproute2 for network namespaces")


def needs_netns(test):
    """Runs in a network namespace: root and iproute2 (tests/real.py); marked `lab` (left out by `make test-py313`)."""
    return pytest.mark.lab(_netns(test))


@contextmanager
def standin(*args: str):
    proc = subprocess.Popen([sys.executable, "-m", "lab.standins", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(fn):
    def probe():
        try:
            return fn() or True
        except Exception:  # noqa: BLE001 - not answering yet, whatever it raises
            return False
    return wait_until(probe, timeout=15, step=0.1)


def test_consul_cli_three_loopback_listeners(tmp_path):
    ports = [free_port("127.0.0.1"), free_port("127.0.0.2"), free_port("127.0.0.3")]
    with standin("consul", f"--server=consul1=127.0.0.1:{ports[0]}", f"--server=consul2=127.0.0.2:{ports[1]}",
                 f"--server=consul3=127.0.0.3:{ports[2]}", "--acl-token=lab-token",
                 f"--state-dir={tmp_path / 'state'}"):
        clients = [consul.Consul(f"127.0.0.{i + 1}", p, token="lab-token") for i, p in enumerate(ports)]
        _ready(clients[0].status.leader)
        # py-consul sends no token on agent.self(); Consul would refuse it with ACLs on, so ask with one.
        names = [requests.get(f"http://127.0.0.{i + 1}:{p}/v1/agent/self", headers={"X-Consul-Token": "lab-token"},
                              timeout=10).json()["Config"]["NodeName"] for i, p in enumerate(ports)]
        assert names == ["consul1", "consul2", "consul3"]
        assert clients[0].status.leader() == "127.0.0.1:8300"
        assert sorted(clients[1].status.peers()) == ["127.0.0.1:8300", "127.0.0.2:8300", "127.0.0.3:8300"]
        assert clients[2].kv.put("cli/x", "1")
        assert clients[0].kv.get("cli/x")[1]["Value"] == b"1"


def test_nomad_cli(tmp_path):
    np = free_port()
    with standin("nomad", f"--listen=127.0.0.1:{np}", "--node=cache1:class=cache", "--node=cache2"):
        n = nomad.Nomad(host="127.0.0.1", port=np)
        _ready(n.nodes.get_nodes)
        assert sorted(x["Name"] for x in n.nodes.get_nodes()) == ["cache1", "cache2"]


@contextmanager
def temp_netns():
    name = f"cs-t{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@needs_netns
def test_consul_listener_inside_netns():
    with temp_netns() as ns:
        inner, outer = free_port(), free_port()
        with standin("consul", f"--server=consul1={ns}:127.0.0.1:{inner}", f"--server=consul2=127.0.0.1:{outer}"):
            _ready(consul.Consul("127.0.0.1", outer).status.leader)
            probe = (f"import consul; c = consul.Consul('127.0.0.1', {inner}); "
                     "print(c.agent.self()['Config']['NodeName'])")
            out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe], cwd=REPO,
                                 capture_output=True, text=True, timeout=30, check=False)
            assert out.stdout.strip() == "consul1", out.stderr
            with socket.socket() as s:  # not reachable from the root namespace
                assert s.connect_ex(("127.0.0.1", inner)) != 0


@needs_netns
def test_raw_exec_task_runs_in_node_netns(tmp_path):
    with temp_netns() as ns:
        st = NomadState([parse_node(f"cache1:netns={ns}")], clock=FakeClock(), state_dir=tmp_path)
        server = InProcServer([(nomad_app(st), sock := free_socket())]).start()
        try:
            n = nomad.Nomad(host="127.0.0.1", port=sock.getsockname()[1])
            out = tmp_path / "ns.txt"
            n.jobs.register_job({"Job": {"ID": "nsjob", "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{
                "Name": "t", "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", f"readlink /proc/self/ns/net > {out}; sleep 60"]},
            }]}]}})
            wait_until(lambda: out.exists() and out.read_text().strip())
            assert out.read_text().strip() == f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]"
            n.job.deregister_job("nsjob", purge=True)
        finally:
            server.stop()
