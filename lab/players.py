"""Player load: thousands of ECS client subnets resolve the steered name; admitted ones play, the rest see maintenance."""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from activities.contracts.dns import ecs_subnets
from activities.dns.axfr import read_state
from activities.dns.ecs import query_clients
from lab.serving import metrics_app, serve_app, stop_on_signals

__all__ = ["PlayerLoad", "main"]


class PlayerLoad:
    """One DNS sweep over all clients every `sweep_s` (their "resolver cache"); HTTP plays at `rps`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.subnets = ecs_subnets(args.ecs_base, args.ecs_prefix, args.clients)
        self.answers: list[str | None] = [None] * args.clients
        self.registry = CollectorRegistry()
        r = self.registry
        self.admitted = Gauge("coldstart_players_admitted_fraction",
                              "share of the clients DNS answered that it sends to the game IP (last sweep; "
                              "NaN when none was answered)", registry=r)
        self.unanswered = Gauge("coldstart_players_dns_unanswered_fraction",
                                "share of clients whose DNS query got no answer in the last sweep", registry=r)
        self.target = Gauge("coldstart_players_target_percent", "steering percent stored in the zone", registry=r)
        self.requests = Counter("coldstart_players_requests", "player requests by outcome", ["outcome"], registry=r)
        self.clients = Gauge("coldstart_players_clients", "distinct client subnets", registry=r)
        self.running = Gauge("coldstart_players_generating", "1 while the generator sends load", registry=r)
        self.clients.set(args.clients)
        for outcome in ("admitted", "maintenance", "error"):
            self.requests.labels(outcome)
        self.target.set(float("nan"))

    async def sweep(self) -> None:
        a = self.args
        answers = await query_clients(a.dns, a.name, self.subnets, concurrency=128, timeout=0.5, attempts=2)
        self.answers = answers
        # A query that timed out is no steering decision: on a loaded host a few time out, and counting them
        # as sent to maintenance read 94 % admitted at 100 %. No answer at all is NaN, which gates fail closed on.
        answered = [x for x in answers if x is not None]
        self.unanswered.set(1 - len(answered) / len(answers))
        self.admitted.set(sum(1 for x in answered if x == a.game_ip) / len(answered) if answered else float("nan"))
        try:
            state = await read_state(a.dns, a.zone, a.name, timeout=1.0)
            self.target.set(state.percent if state.percent is not None else float("nan"))
        except Exception:  # noqa: BLE001 - whatever the failure, the target is unknown
            self.target.set(float("nan"))  # unknown beats stale: a gate must not pass on old data

    async def play(self, http: aiohttp.ClientSession, client: int) -> None:
        a = self.args
        answer = self.answers[client]
        if answer is None:
            self.requests.labels("error").inc()
            return
        # A client is one player's session: it keeps reading its own state, so an admitted
        # cohort warms its part of the cache and the hit ratio recovers within a ramp step.
        player = client % a.players + 1
        try:
            async with http.get(f"http://{answer}:{a.port}/play", params={"player": str(player)}) as resp:
                await resp.read()
                if answer == a.game_ip and resp.status < 500:
                    self.requests.labels("admitted").inc()
                elif answer == a.maint_ip:
                    self.requests.labels("maintenance").inc()
                else:
                    self.requests.labels("error").inc()
        except (TimeoutError, aiohttp.ClientError, OSError):
            self.requests.labels("error").inc()

    async def run(self, stop: asyncio.Event) -> None:
        a = self.args
        deadline = time.monotonic() + a.duration
        timeout = aiohttp.ClientTimeout(total=2)
        connector = aiohttp.TCPConnector(limit=64)
        self.running.set(1)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            next_sweep = 0.0
            inflight: set[asyncio.Task] = set()
            while not stop.is_set() and time.monotonic() < deadline:
                tick = time.monotonic()
                if tick >= next_sweep:
                    try:
                        await self.sweep()
                    except OSError:
                        pass
                    next_sweep = time.monotonic() + a.sweep_s
                # Bounded: at most `rps` starts per second and at most 64 requests in flight.
                for _ in range(int(a.rps)):
                    if len(inflight) >= 64:
                        break
                    task = asyncio.create_task(self.play(http, random.randrange(a.clients)))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                try:
                    await asyncio.wait_for(stop.wait(), max(0.0, 1.0 - (time.monotonic() - tick)))
                except TimeoutError:
                    pass
            for task in list(inflight):
                task.cancel()
        self.running.set(0)


async def serve(args: argparse.Namespace) -> None:
    load = PlayerLoad(args)
    runner = await serve_app(metrics_app(load.registry), args.metrics)
    stop = stop_on_signals()
    print(f"players: {args.clients} clients, {args.rps} rps for {args.duration}s; metrics on {args.metrics}", flush=True)
    await load.run(stop)
    # After the run time the exporter stays up (idle) so Prometheus still sees the last values.
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.players", description=__doc__)
    ap.add_argument("--dns", required=True, help="authoritative server ip:port")
    ap.add_argument("--zone", required=True)
    ap.add_argument("--name", required=True, help="absolute steered name")
    ap.add_argument("--game-ip", required=True)
    ap.add_argument("--maint-ip", required=True)
    ap.add_argument("--port", type=int, required=True, help="HTTP port on game and maintenance IPs")
    ap.add_argument("--metrics", required=True, help="HOST:PORT for /metrics")
    ap.add_argument("--clients", type=int, default=2000)
    ap.add_argument("--ecs-base", default="100.64.0.0/10")
    ap.add_argument("--ecs-prefix", type=int, default=24)
    ap.add_argument("--rps", type=float, default=50.0)
    ap.add_argument("--sweep-s", type=float, default=5.0)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--players", type=int, default=2000, help="player ids 1..N exist in the database")
    args = ap.parse_args(argv)
    if not 0 < args.rps <= 2000 or not 0 < args.duration <= 86400 or not 0 < args.clients <= 65536:
        ap.error("rps must be in (0, 2000], duration in (0, 86400] s, clients in (0, 65536]")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
