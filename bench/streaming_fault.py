"""The streaming fault on the lab's real agents: the Consul servers' CPU and KV apply p50 with no fault, with
the fault and streaming on, and with the fault after consul.agents.streaming turned it off. Needs root.

    .venv/bin/python bench/streaming_fault.py [--window 40] [--settle 20] [--keep-dir DIR]

Server CPU: the three server processes' CPU seconds over the window (psutil), as % of one core. KV apply
p50: coldstart:consul_kvs_apply_p50_ms from the lab's Prometheus at the window's end. Streams: the servers'
consul.grpc.server.streams (internal) at the window's end, the agents' streaming subscriptions.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from activities.consul.agents import AgentsStreamingInput, agents_streaming
from lab.faults import inject
from lab.hosts.state import load_state
from lab.lifecycle import down, up
from lab.services import Secrets
from lab.settings import CONSUL_HOSTS, LabConfig
from workflows.loader import read_inventory

LAB = {"prefix": "css", "bridge": "cssbr0", "veth_prefix": "cssv", "subnet": ipaddress.IPv4Network("10.224.0.0/24")}


def _server_cpu(cfg: LabConfig) -> float:
    daemons = load_state(cfg.state_dir).daemons
    return sum(sum(psutil.Process(daemons[f"{h}/consul"].pid).cpu_times()[:2]) for h in CONSUL_HOSTS)


def _kv_p50(cfg: LabConfig) -> float | None:
    r = httpx.get(f"{cfg.prometheus_url}/api/v1/query", params={"query": "coldstart:consul_kvs_apply_p50_ms"}, timeout=10)
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _streams(cfg: LabConfig) -> int:
    """Streams the servers serve to agents (consul.grpc.server.streams, the internal gRPC server)."""
    headers = {"X-Consul-Token": Secrets(cfg).read("consul-token")}
    total = 0.0
    for host in CONSUL_HOSTS:
        text = httpx.get(f"{cfg.url(host, cfg.ports.consul_http)}/v1/agent/metrics", params={"format": "prometheus"},
                         headers=headers, timeout=10).text
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith('consul_grpc_server_streams{server_type="internal"}'))
    return int(total)


def _measure(cfg: LabConfig, settle: float, window: float) -> tuple[float, float | None, int]:
    time.sleep(settle)
    cpu0, t0 = _server_cpu(cfg), time.monotonic()
    time.sleep(window)
    cpu = 100 * (_server_cpu(cfg) - cpu0) / (time.monotonic() - t0)
    return cpu, _kv_p50(cfg), _streams(cfg)


def main(root: Path, settle: float, window: float) -> int:
    console = Console(width=160)
    cfg = LabConfig(state_dir=root / "state", inventory_path=root / "targets" / "lab.yaml", **LAB)
    rows = []
    try:
        info = up(cfg)
        if not all(how.startswith("real") for how in info["backends"].values()):
            console.print(f"needs the real agents: {info['backends']}")
            return 2
        rows.append(("no fault, streaming on", *_measure(cfg, settle, window)))
        console.print(f"consul-streaming: {inject(cfg, 'consul-streaming')}", highlight=False)
        rows.append(("fault, streaming on", *_measure(cfg, settle, window)))
        inv = read_inventory(cfg.inventory_path)
        token_file = root / "vault-token"
        token_file.write_text(Secrets(cfg).read("vault-root-token"))
        assert inv.consul is not None and inv.consul.token is not None
        target = inv.consul.model_copy(update={"token": inv.consul.token.model_copy(update={"token_file": str(token_file)})})
        t0 = time.monotonic()
        out = asyncio.run(agents_streaming(AgentsStreamingInput(consul=target, agents=inv.consul_agents, enabled=False)))
        console.print(f"consul.agents.streaming off: {out.changed_agents} in {time.monotonic() - t0:.1f} s", highlight=False)
        rows.append(("fault, streaming off", *_measure(cfg, settle, window)))
    finally:
        down(cfg)
    table = Table("phase", "servers' CPU (% of a core, 3 servers)", "KV apply p50 (ms)", "streams served")
    for name, cpu, p50, streams in rows:
        table.add_row(name, f"{cpu:.0f}", "n/a" if p50 is None else f"{p50:.2f}", str(streams))
    console.print(table)
    console.print(f"window {window:.0f} s after {settle:.0f} s to settle")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--keep-dir", type=Path)
    args = parser.parse_args()
    sys.exit(main(args.keep_dir or Path(tempfile.mkdtemp(prefix="coldstart-streaming-")), args.settle, args.window))
