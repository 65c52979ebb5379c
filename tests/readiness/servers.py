"""Real servers the readiness tests check: a Prometheus with a given config, a Consul dev agent for snapshots."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from runtime.processes import free_port, start_process
from tests.real import unavailable

__all__ = ["consul_dev", "prometheus", "pushgateway"]

HASHISTACK = Path(__file__).resolve().parents[2] / ".cache" / "hashistack"


def _answering(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f}s")


@contextmanager
def prometheus(tmp: Path, config: str) -> Iterator[str]:
    """Debian's Prometheus serving `config` (prometheus.yml text); yields its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        unavailable("prometheus is not on PATH (Debian: apt-get install prometheus)")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "prometheus.yml").write_text(config)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    with start_process(argv, log=tmp / "prometheus.log", port=port):
        _answering(f"{url}/-/ready")
        yield url


@contextmanager
def consul_dev(tmp: Path) -> Iterator[str]:
    """A real Consul agent in dev mode (one server, in memory); yields its HTTP URL."""
    binary = HASHISTACK / "consul"
    if not binary.exists():
        found = shutil.which("consul")
        if found is None:
            unavailable("no consul binary (.cache/hashistack or PATH)")
        binary = Path(found)
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(binary), "agent", "-dev", "-bind=127.0.0.1", "-client=127.0.0.1", f"-http-port={port}",
            "-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1", f"-server-port={free_port()}",
            f"-serf-lan-port={free_port()}", f"-serf-wan-port={free_port()}"]
    with start_process(argv, log=tmp / "consul.log", port=port):
        _answering(f"{url}/v1/status/leader")
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/v1/status/leader", timeout=1).json() in ("", None):
            if time.monotonic() > deadline:
                raise RuntimeError("the Consul dev agent elected no leader in 30s")
            time.sleep(0.1)
        yield url


@contextmanager
def pushgateway(tmp: Path) -> Iterator[str]:
    """Debian's Pushgateway, in memory; yields its URL."""
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None:
        unavailable("no Pushgateway on PATH (Debian: apt-get install prometheus-pushgateway)")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with start_process([binary, f"--web.listen-address=127.0.0.1:{port}"], log=tmp / "pushgateway.log", port=port):
        _answering(f"{url}/-/ready")
        yield url
