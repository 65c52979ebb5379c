"""The weekly trial restore: the newest snapshot restored into a scratch Consul agent, its keys counted against the archive's."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from activities.consul.archive import ArchiveError, read_snapshot
from activities.retry import format_duration
from runtime.processes import free_port, start_process
from runtime.readiness.model import Verdict, not_ready, ready, unknown
from runtime.readiness.snapshots import newest_snapshot

__all__ = ["trial_restore_verdict"]


def _wait_leader(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/status/leader", timeout=1).json() not in ("", None):
                return
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the scratch agent elected no leader within {timeout:.0f}s")


def _restore(consul: str, store: Path, pattern: str) -> Verdict:
    newest = newest_snapshot(store, pattern)
    if newest is None:
        return not_ready(f"no readable snapshot in {store} ({pattern}) to restore")
    path = newest[1]
    try:
        expected = len(read_snapshot(path).kv)
    except ArchiveError as exc:
        return not_ready(f"the newest snapshot does not verify or decode: {exc}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coldstart-trial-") as scratch:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # A dev agent: one server in memory on loopback, every other listener off or on a free port.
        argv = [consul, "agent", "-dev", "-bind=127.0.0.1", "-client=127.0.0.1", f"-http-port={port}",
                "-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1", f"-server-port={free_port()}",
                f"-serf-lan-port={free_port()}", f"-serf-wan-port={free_port()}"]
        with start_process(argv, log=Path(scratch) / "consul.log", port=port):
            _wait_leader(url, 30)
            with path.open("rb") as body:
                reply = httpx.put(f"{url}/v1/snapshot", content=body, timeout=300)
            if reply.status_code != 200:
                return not_ready(f"{path.name} does not restore: HTTP {reply.status_code} {reply.text.strip()[:200]}")
            keys = httpx.get(f"{url}/v1/kv/", params={"keys": "true"}, timeout=60)
            restored = len(keys.json()) if keys.status_code == 200 else 0
    took = format_duration(round(time.monotonic() - started, 1))
    if restored != expected:
        return not_ready(f"{path.name} restored {restored} keys into a scratch agent, the archive holds {expected}")
    return ready(f"{path.name} restored into a scratch Consul agent in {took}: {restored} keys, as the archive holds")


async def trial_restore_verdict(store: str, *, pattern: str = "*.snap", consul: str | None = None) -> Verdict:
    binary = consul or shutil.which("consul")
    if binary is None:
        return unknown("no consul binary on this host to restore into")
    return await asyncio.to_thread(_restore, binary, Path(store), pattern)
