"""Internal-services load on Consul, from the services that are switched on; failed calls retry as a storm."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import time
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from lab.serving import metrics_app, serve_app, stop_on_signals

__all__ = ["InternalLoad", "main"]

SERVICES = ("inventory", "matchmaker", "chat", "avatar", "economy")
REFRESH_S = 2.0


class InternalLoad:
    """Mixed calls spread over the servers at up to `rps`; failed calls pile up (bounded) and are
    re-sent at `storm_rps` as soon as calls succeed again — the reconnect storm after an unblock.

    With a users file, the load is causal: each service sends its share only while its usage flag
    in Consul KV says "enabled" (essential ones always), scaled by its Nomad job's current count
    against its baseline — so consul.user.disable really takes load off Consul.
    """

    def __init__(self, args: argparse.Namespace, token: str | None) -> None:
        self.args = args
        self.headers = {"X-Consul-Token": token} if token else {}
        self.backlog = 0
        self.last_ok = True
        self.users: list[dict] = json.loads(Path(args.users_file).read_text()) if args.users_file else [
            {"name": name, "essential": True, "count": 1} for name in SERVICES]
        self.share = {u["name"]: 1.0 for u in self.users}
        self.enabled = {u["name"]: True for u in self.users}
        self.counts = {u["name"]: u["count"] for u in self.users}
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("coldstart_internal_consul_requests", "Consul calls by outcome", ["outcome"],
                                registry=r)
        self.backlog_g = Gauge("coldstart_internal_retry_backlog", "failed calls waiting to be re-sent", registry=r)
        self.running = Gauge("coldstart_internal_generating", "1 while the generator sends load", registry=r)
        self.share_g = Gauge("coldstart_internal_service_share", "a service's load against its baseline (0 = off)",
                             ["service"], registry=r)
        self.rate_g = Gauge("coldstart_internal_target_rps", "calls per second the services ask for now", registry=r)
        for outcome in ("ok", "error"):
            self.requests.labels(outcome)
        self._publish()

    def _publish(self) -> None:
        for name, share in self.share.items():
            self.share_g.labels(name).set(share)
        self.rate_g.set(self.rate())

    def rate(self) -> float:
        return self.args.rps * sum(self.share.values()) / max(len(self.share), 1)

    async def refresh(self, http: aiohttp.ClientSession) -> None:
        """Read each service's flag (Consul KV) and job count (Nomad); keep the last answer when unreachable."""
        if not self.args.users_file:
            return
        prefix = self.users[0]["flag"].rsplit("/", 1)[0]
        try:
            async with http.get(f"{random.choice(self.args.consul)}/v1/kv/{prefix}", params={"recurse": "true"}) as resp:
                if resp.status in (200, 404):
                    entries = await resp.json() if resp.status == 200 else []
                    flags = {e["Key"]: base64.b64decode(e["Value"] or "").decode() for e in entries}
                    for user in self.users:
                        self.enabled[user["name"]] = user["essential"] or flags.get(user["flag"]) == "enabled"
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            pass  # Consul blocked or down: the services keep doing what they did
        for user in self.users:
            if not (self.args.nomad and user.get("job")):
                continue
            try:
                async with http.get(f"{self.args.nomad}/v1/job/{user['job']}") as resp:
                    if resp.status == 200:
                        job = await resp.json()
                        self.counts[user["name"]] = 0 if job.get("Stop") else sum(
                            g.get("Count", 0) for g in job["TaskGroups"])
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError):
                pass
        for user in self.users:
            name = user["name"]
            self.share[name] = self.counts[name] / user["count"] if self.enabled[name] else 0.0
        self._publish()

    async def call(self, http: aiohttp.ClientSession) -> None:
        server = random.choice(self.args.consul)
        names = list(self.share)
        weights = [self.share[n] for n in names]
        svc = random.choices(names, weights)[0] if sum(weights) else random.choice(names)
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
        except (TimeoutError, aiohttp.ClientError, OSError):
            ok = False
        self.requests.labels("ok" if ok else "error").inc()
        self.last_ok = ok
        if not ok:
            self.backlog = min(self.backlog + 1, self.args.max_backlog)
        self.backlog_g.set(self.backlog)

    async def watch(self, slot: int, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        """One service instance's blocking query on the shared prefix: every write wakes it and it asks
        again at once, so watchers multiply the servers' work per write (the outage's fan-out)."""
        index = "0"
        while not stop.is_set():
            # Slots beyond the services' current share sleep: disabled services stop watching too.
            if slot >= self.args.watchers * self.rate() / max(self.args.rps, 1e-9):
                await asyncio.sleep(REFRESH_S)
                continue
            try:
                async with http.get(f"{random.choice(self.args.consul)}/v1/kv/coldstart/internal/",
                                    params={"recurse": "true", "index": index, "wait": "10s"}) as resp:
                    await resp.read()
                    index = resp.headers.get("X-Consul-Index", "0") if resp.status == 200 else "0"
                    if resp.status != 200:
                        await asyncio.sleep(1.0)
            except (TimeoutError, aiohttp.ClientError, OSError):
                await asyncio.sleep(1.0)  # blocked or down: try again later, like a client library

    async def run(self, stop: asyncio.Event) -> None:
        a = self.args
        deadline = time.monotonic() + a.duration
        # force_close: every call is a new TCP connection, like many short-lived service clients.
        connector = aiohttp.TCPConnector(limit=a.concurrency, force_close=True)
        timeout = aiohttp.ClientTimeout(total=a.timeout)
        inflight: set[asyncio.Task] = set()
        budget = 0.0
        self.running.set(1)
        watch_http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20), headers=self.headers,
                                           connector=aiohttp.TCPConnector(limit=max(a.watchers, 1)))
        watchers = [asyncio.create_task(self.watch(i, watch_http, stop)) for i in range(a.watchers)]
        async with watch_http, aiohttp.ClientSession(timeout=timeout, connector=connector,
                                                     headers=self.headers) as http:
            await self.refresh(http)
            last = refreshed = time.monotonic()
            while not stop.is_set() and time.monotonic() < deadline:
                now = time.monotonic()
                dt, last = now - last, now
                if now - refreshed >= REFRESH_S:
                    refreshed = now
                    task = asyncio.create_task(self.refresh(http))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                rate = self.rate()
                budget = min(budget + rate * dt, max(rate, 1.0))
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
                except TimeoutError:
                    pass
            for task in [*inflight, *watchers]:
                task.cancel()
        self.running.set(0)


async def serve(args: argparse.Namespace) -> None:
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    load = InternalLoad(args, token)
    runner = await serve_app(metrics_app(load.registry), args.metrics)
    stop = stop_on_signals()
    print(f"internal load: {args.rps} rps on {len(args.consul)} servers for {args.duration}s", flush=True)
    await load.run(stop)
    await stop.wait()  # stay scrapeable after the run time
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.internal_load", description=__doc__)
    ap.add_argument("--consul", action="append", required=True, help="Consul server URL (repeat)")
    ap.add_argument("--token-file")
    ap.add_argument("--users-file", help="JSON list of services (name, essential, count, flag, job): causal load")
    ap.add_argument("--nomad", help="Nomad URL for the services' job counts")
    ap.add_argument("--metrics", required=True, help="HOST:PORT for /metrics")
    ap.add_argument("--rps", type=float, default=20.0)
    ap.add_argument("--storm-rps", type=float, default=500.0, help="rate at which queued retries are re-sent")
    ap.add_argument("--max-backlog", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--watchers", type=int, default=0, help="blocking queries held open on the services' prefix")
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=3600.0)
    args = ap.parse_args(argv)
    if not 0 < args.rps <= 2000 or not 0 < args.storm_rps <= 5000 or not 0 < args.duration <= 86400:
        ap.error("rps in (0, 2000], storm-rps in (0, 5000], duration in (0, 86400] s")
    if not 0 <= args.watchers <= 2000:
        ap.error("watchers in [0, 2000]")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
