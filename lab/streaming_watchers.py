"""Streaming load on a Consul client agent: many health watchers of its services, under check-status churn."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

import httpx

__all__ = ["main"]


async def _register(client: httpx.AsyncClient, agent: str, services: int, prefix: str) -> None:
    for i in range(services):
        body = {"Name": f"{prefix}{i}", "ID": f"{prefix}{i}", "Port": 20000 + i,
                "Check": {"CheckID": f"{prefix}{i}-ttl", "TTL": "24h", "Status": "passing"}}
        (await client.put(f"{agent}/v1/agent/service/register", json=body)).raise_for_status()


async def _watch(client: httpx.AsyncClient, agent: str, service: str, me: int, stop: float) -> None:
    # A filter of its own makes each watcher its own view (one stream a watcher while streaming is on),
    # as thousands of separate agents would be; blocking with index, as a watch does.
    index = 1
    while time.monotonic() < stop:
        try:
            r = await client.get(f"{agent}/v1/health/service/{service}",
                                 params={"index": index, "wait": "20s", "filter": f'Service.ID != "w{me}"'})
            index = max(1, int(r.headers.get("X-Consul-Index", index)))
        except (httpx.HTTPError, ValueError):
            await asyncio.sleep(0.5)


async def _churn(client: httpx.AsyncClient, agent: str, services: int, prefix: str, rate: float, stop: float) -> None:
    # Each status change is a catalog write the agent syncs at once, and an event for every watcher of it.
    n = 0
    while time.monotonic() < stop:
        i = random.randrange(services)
        state = "pass" if n % 2 else "warn"
        try:
            await client.put(f"{agent}/v1/agent/check/{state}/{prefix}{i}-ttl", params={"note": str(n)})
        except httpx.HTTPError:
            await asyncio.sleep(0.5)
        n += 1
        await asyncio.sleep(1.0 / rate)


async def run(args: argparse.Namespace) -> None:
    token = Path(args.token_file).read_text().strip()
    stop = time.monotonic() + args.duration
    limits = httpx.Limits(max_connections=args.watchers + 8, max_keepalive_connections=args.watchers + 8)
    async with httpx.AsyncClient(headers={"X-Consul-Token": token}, timeout=60, limits=limits) as client:
        while True:
            try:
                await _register(client, args.agent, args.services, args.prefix)
                break
            except httpx.HTTPError:
                await asyncio.sleep(1.0)  # the agent may still be starting
        await asyncio.gather(
            *(_watch(client, args.agent, f"{args.prefix}{w % args.services}", w, stop) for w in range(args.watchers)),
            _churn(client, args.agent, args.services, args.prefix, args.churn, stop))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.streaming_watchers", description=__doc__)
    parser.add_argument("--agent", required=True, help="the local client agent's HTTP API")
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--services", type=int, default=40)
    parser.add_argument("--watchers", type=int, default=400)
    parser.add_argument("--churn", type=float, default=50.0, help="check status changes a second")
    parser.add_argument("--prefix", default="stream-svc")
    parser.add_argument("--duration", type=float, default=3600.0)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
