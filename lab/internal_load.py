"""Internal-services load on Consul: KV reads/writes and health queries; failed calls queue and retry as a storm."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

__all__ = ["InternalLoad", "main"]

SERVICES = ("inventory", "matchmaker", "chat", "avatar", "economy")


class InternalLoad:
    """Steady `rps` of mixed calls spread over the servers; failed calls pile up (bounded) and are
    re-sent at `storm_rps` as soon as calls succeed again — the reconnect storm after an unblock."""

    def __init__(self, args: argparse.Namespace, token: str | None) -> None:
        self.args = args
        self.headers = {"X-Consul-Token": token} if token else {}
        self.backlog = 0
        self.last_ok = True
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("coldstart_internal_consul_requests", "Consul calls by outcome", ["outcome"],
                                registry=r)
        self.backlog_g = Gauge("coldstart_internal_retry_backlog", "failed calls waiting to be re-sent", registry=r)
        self.running = Gauge("coldstart_internal_generating", "1 while the generator sends load", registry=r)
        for outcome in ("ok", "error"):
            self.requests.labels(outcome)

    async def call(self, http: aiohttp.ClientSession) -> None:
        server = random.choice(self.args.consul)
        svc = random.choice(SERVICES)
        kind = random.random()
        try:
            if kind < 0.5:
                req = http.get(f"{server}/v1/kv/coldstart/internal/{svc}")
            elif kind < 0.7:
                body = json.dumps({"updated": time.time()})
                req = http.put(f"{server}/v1/kv/coldstart/internal/{svc}", data=body)
            else:
                req = http.get(f"{server}/v1/health/service/{svc}")
            async with req as resp:
                await resp.read()
                ok = resp.status < 500 and resp.status not in (403, 429)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            ok = False
        self.requests.labels("ok" if ok else "error").inc()
        self.last_ok = ok
        if not ok:
            self.backlog = min(self.backlog + 1, self.args.max_backlog)
        self.backlog_g.set(self.backlog)

    async def register(self, http: aiohttp.ClientSession) -> None:
        for i, svc in enumerate(SERVICES):
            server = self.args.consul[i % len(self.args.consul)]
            payload = {"Name": svc, "ID": svc, "Port": 8000 + i,
                       "Check": {"CheckID": f"{svc}-ttl", "TTL": "3600s", "Status": "passing"}}
            try:
                async with http.put(f"{server}/v1/agent/service/register", json=payload) as resp:
                    await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass  # the load itself reports Consul trouble; registration is best effort

    async def run(self, stop: asyncio.Event) -> None:
        a = self.args
        deadline = time.monotonic() + a.duration
        # force_close: every call is a new TCP connection, like many short-lived service clients.
        connector = aiohttp.TCPConnector(limit=a.concurrency, force_close=True)
        timeout = aiohttp.ClientTimeout(total=a.timeout)
        inflight: set[asyncio.Task] = set()
        budget = 0.0
        self.running.set(1)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=self.headers) as http:
            await self.register(http)
            last = time.monotonic()
            while not stop.is_set() and time.monotonic() < deadline:
                now = time.monotonic()
                dt, last = now - last, now
                budget = min(budget + a.rps * dt, a.rps)
                if self.last_ok and self.backlog:
                    drain = min(self.backlog, int(a.storm_rps * dt) + 1)
                    self.backlog -= drain
                    budget += drain
                while budget >= 1 and len(inflight) < a.concurrency:
                    budget -= 1
                    task = asyncio.create_task(self.call(http))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                try:
                    await asyncio.wait_for(stop.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
            for task in list(inflight):
                task.cancel()
        self.running.set(0)


async def serve(args: argparse.Namespace) -> None:
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    load = InternalLoad(args, token)
    app = web.Application()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(load.registry), content_type="text/plain", charset="utf-8")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, _, port = args.metrics.rpartition(":")
    await web.TCPSite(runner, host, int(port)).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"internal load: {args.rps} rps on {len(args.consul)} servers for {args.duration}s", flush=True)
    await load.run(stop)
    await stop.wait()  # stay scrapeable after the run time
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.internal_load", description=__doc__)
    ap.add_argument("--consul", action="append", required=True, help="Consul server URL (repeat)")
    ap.add_argument("--token-file")
    ap.add_argument("--metrics", required=True, help="HOST:PORT for /metrics")
    ap.add_argument("--rps", type=float, default=20.0)
    ap.add_argument("--storm-rps", type=float, default=500.0, help="rate at which queued retries are re-sent")
    ap.add_argument("--max-backlog", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=3600.0)
    args = ap.parse_args(argv)
    if not 0 < args.rps <= 2000 or not 0 < args.storm_rps <= 5000 or not 0 < args.duration <= 86400:
        ap.error("rps in (0, 2000], storm-rps in (0, 5000], duration in (0, 86400] s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
