"""Shared pieces of the lab tests: the test lab's spec, skip check, probe scripts."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

from lab.hosts import LabSpec, netns_usable, run_in_host
from tests.real import unavailable

__all__ = [
    "CONNECT_PROBE", "ECHO_PORT", "ECHO_SERVER", "HTTP_PORT", "connect", "connect_from", "lab_spec", "require_lab",
]

HTTP_PORT = 8500  # Consul's HTTP API port, served here by python -m http.server
ECHO_PORT = 8300  # Consul's server RPC port, served by a tiny echo server holding connections open

ECHO_SERVER = """
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen()
def serve(conn):
    with conn:
        while data := conn.recv(1024):
            conn.sendall(data)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def require_lab() -> None:
    reason = netns_usable()
    if reason:
        unavailable(f"lab tests need root and usable `ip netns`: {reason}")


def lab_spec(state_dir: Path, *, prefix: str = "cs-test", bridge: str = "cstestbr0",
             veth_prefix: str = "cstv", subnet: str = "10.213.250.0/24",
             ssh_hosts: tuple[str, ...] = ("consul1",)) -> LabSpec:
    """A lab that cannot collide with the default one: own prefix, bridge, veths and subnet."""
    return LabSpec(
        prefix=prefix,
        bridge=bridge,
        veth_prefix=veth_prefix,
        subnet=ipaddress.IPv4Network(subnet),
        hosts={"consul1": 11, "nomad": 20, "players": 90},
        ssh_hosts=list(ssh_hosts),
        state_dir=state_dir,
    )


# Prints how a TCP connect + one round trip went: "connected", "refused", "timeout" or an error name.
CONNECT_PROBE = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as conn:
        conn.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        conn.recv(64)
    print("connected")
except ConnectionRefusedError:
    print("refused")
except (socket.timeout, TimeoutError):
    print("timeout")
except OSError as exc:
    print(type(exc).__name__)
"""


def connect(address: str, port: int) -> str:
    """Probe from the root namespace, i.e. from the controller address on the bridge."""
    proc = subprocess.run([sys.executable, "-c", CONNECT_PROBE, address, str(port)],
                          capture_output=True, text=True, timeout=10, check=False)
    return proc.stdout.strip() or proc.stderr.strip()


def connect_from(spec: LabSpec, host: str, address: str, port: int) -> str:
    """Probe from inside another lab host."""
    proc = run_in_host(spec, host, [sys.executable, "-c", CONNECT_PROBE, address, str(port)], timeout=10)
    return proc.stdout.strip() or proc.stderr.strip()
