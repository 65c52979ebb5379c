"""Synthetic Consul KV writes from the telemetry host, so write latency is measured even while clients are blocked."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from pathlib import Path

import httpx
import typer

__all__ = ["main"]


def main(
    consul: list[str] = typer.Option(..., help="Consul server URL (repeat); writes go round-robin"),
    token_file: Path = typer.Option(..., help="file holding a Consul token that may write the canary key"),
    key: str = typer.Option("coldstart/canary", help="KV key written"),
    interval: float = typer.Option(1.0, min=0.1, max=60),
    duration: float = typer.Option(3600.0, min=1, max=86400, help="seconds; then it stops writing"),
) -> None:
    # Consul's consul.kvs.apply summary is empty (NaN) when nothing writes, and a gate must not
    # read "no data" as healthy or sick: the telemetry host is let through a client block, so its
    # canary keeps a steady trickle of real writes for the latency to be measured on.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    headers = {"X-Consul-Token": token_file.read_text().strip()}
    deadline = time.monotonic() + duration
    print(f"consul canary: {key} every {interval}s on {len(consul)} servers", flush=True)
    with httpx.Client(headers=headers, timeout=10) as http:
        for server in itertools.cycle(consul):
            if stop.is_set() or time.monotonic() > deadline:
                break
            started = time.monotonic()
            try:
                http.put(f"{server}/v1/kv/{key}", content=str(time.time()).encode())
            except httpx.HTTPError:
                pass  # blocked or down: the latency series shows it (no new observations)
            stop.wait(max(0.0, interval - (time.monotonic() - started)))


if __name__ == "__main__":
    typer.run(main)
