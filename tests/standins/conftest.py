"""Fixtures that run the stand-ins in-process on free loopback ports and tear them down."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import consul
import pytest
import requests

from lab.standins.clock import FakeClock, RealClock
from lab.standins.consul import build_cluster
from lab.standins.consul import make_app as consul_app
from lab.standins.consul_load import LoadParams
from lab.standins.consul_state import ConsulCluster
from lab.standins.inproc import InProcServer, free_socket
from lab.standins.nomad import make_app as nomad_app
from lab.standins.nomad import parse_node
from lab.standins.nomad_state import NomadState

SERVERS = ("consul1", "consul2", "consul3")


def wait_until(pred: Callable[[], object], timeout: float = 10.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)


@dataclass
class ConsulLab:
    cluster: ConsulCluster
    clock: FakeClock | RealClock
    server: InProcServer
    ports: dict[str, int]

    def client(self, name: str = "consul1", token: str | None = None) -> consul.Consul:
        return consul.Consul("127.0.0.1", self.ports[name], token=token)

    def admin(self, name: str = "consul1") -> str:
        return f"http://127.0.0.1:{self.ports[name]}/_lab/faults"

    def fault(self, **body) -> dict:
        resp = requests.post(self.admin(), json=body, timeout=10)
        resp.raise_for_status()
        return resp.json()


def start_consul(clock, params=None, acl_token=None, state_dir=None) -> ConsulLab:
    socks = {n: free_socket() for n in SERVERS}
    cluster = build_cluster([(n, "127.0.0.1") for n in SERVERS], clock=clock, params=params,
                            acl_token=acl_token, state_dir=state_dir, seed=7)
    pairs = [(consul_app(cluster, n, run_housekeeping=(i == 0)), socks[n]) for i, n in enumerate(SERVERS)]
    server = InProcServer(pairs).start()
    return ConsulLab(cluster, clock, server, {n: s.getsockname()[1] for n, s in socks.items()})


@pytest.fixture
def consul_lab():
    lab = start_consul(FakeClock(), LoadParams(rate_window_s=1.0))
    yield lab
    lab.server.stop()


@pytest.fixture
def consul_acl_lab():
    lab = start_consul(FakeClock(), acl_token="s3cret")
    yield lab
    lab.server.stop()


@dataclass
class NomadLab:
    state: NomadState
    clock: FakeClock
    server: InProcServer
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_nomad(clock, state_dir=None) -> NomadLab:
    st = NomadState([parse_node(f"cache{i}:netns_hint=none,role=cache") for i in (1, 2, 3)],
                    clock=clock, state_dir=state_dir)
    sock = free_socket()
    server = InProcServer([(nomad_app(st), sock)]).start()
    return NomadLab(st, clock, server, sock.getsockname()[1])


@pytest.fixture
def nomad_lab(tmp_path):
    lab = start_nomad(FakeClock(), tmp_path / "nomad")
    yield lab
    lab.server.stop()
