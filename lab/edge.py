"""The game edge: cache-aside player reads (Redis nodes from Consul KV, then PostgreSQL) plus a maintenance page."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import zlib
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from lab.serving import serve_app, stop_on_signals

__all__ = ["SCHEDULING_KEY", "EdgeService", "main"]

# Where the cache job's placement lives; a restore of an old snapshot leaves stale nodes here.
SCHEDULING_KEY = "coldstart/cache/scheduling"
CACHE_TTL_S = 300
MAINTENANCE_PAGE = "<html><body><h1>Down for maintenance</h1><p>We are bringing the game back.</p></body></html>\n"


class EdgeService:
    """Owns the metrics, the Redis clients (by address) and the PostgreSQL pool."""

    def __init__(self, *, dsn: str, consul: str, consul_token: str | None, static_nodes: list[str]) -> None:
        self.dsn, self.consul, self.consul_token = dsn, consul, consul_token
        self.nodes: list[str] = list(static_nodes)
        self.caches: dict[str, Redis] = {}
        self.db = None
        self.registry = CollectorRegistry()
        r = self.registry
        self.cache_requests = Counter("game_cache_requests", "cache reads by result", ["result"], registry=r)
        self.cache_errors = Counter("game_cache_errors", "cache reads that failed (counted as misses too)",
                                    ["node"], registry=r)
        self.db_queries = Counter("game_db_queries", "database queries", registry=r)
        self.db_duration = Histogram("game_db_query_duration_seconds", "database query time", registry=r,
                                     buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.requests = Counter("game_requests", "game requests by HTTP status", ["code"], registry=r)
        self.duration = Histogram("game_request_duration_seconds", "game request time", registry=r,
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.maint_requests = Counter("game_maintenance_requests", "maintenance page views", registry=r)
        self.cache_nodes = Gauge("game_cache_nodes", "cache nodes the edge currently uses", registry=r)
        self.cache_nodes.set(len(self.nodes))
        for result in ("hit", "miss"):
            self.cache_requests.labels(result)

    # ---- dependencies ------------------------------------------------------------------
    async def start(self) -> None:
        import asyncpg  # imported here so `--help` works without it

        self.db = await asyncpg.create_pool(self.dsn, min_size=1, max_size=8, command_timeout=5)
        self._refresher = asyncio.create_task(self._refresh_nodes())

    async def stop(self) -> None:
        self._refresher.cancel()
        for cache in self.caches.values():
            await cache.aclose()
        if self.db is not None:
            await self.db.close()

    async def _refresh_nodes(self) -> None:
        headers = {"X-Consul-Token": self.consul_token} if self.consul_token else {}
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
            while True:
                try:
                    async with http.get(f"{self.consul}/v1/kv/{SCHEDULING_KEY}", params={"raw": "1"}) as resp:
                        if resp.status == 200:
                            nodes = json.loads(await resp.text()).get("nodes", [])
                            if nodes and nodes != self.nodes:
                                self.nodes = [str(n) for n in nodes]
                                self.cache_nodes.set(len(self.nodes))
                except (TimeoutError, aiohttp.ClientError, ValueError):
                    pass  # keep serving with the last placement we knew: Consul being down is the drill
                await asyncio.sleep(2.0)

    def _cache(self, player: int) -> tuple[str, Redis] | None:
        if not self.nodes:
            return None
        # crc32, not hash(): stable across processes, so a restart keeps keys on the same node.
        address = self.nodes[zlib.crc32(str(player).encode()) % len(self.nodes)]
        if address not in self.caches:
            host, _, port = address.rpartition(":")
            # At most 8 connections, callers wait for one; no retries: a failed read counts as a miss.
            self.caches[address] = Redis.from_pool(BlockingConnectionPool(
                host=host, port=int(port), max_connections=8, timeout=None,
                socket_timeout=0.5, socket_connect_timeout=0.5))
        return address, self.caches[address]

    # ---- the request path ----------------------------------------------------------------
    async def player(self, player: int) -> dict:
        key = f"player:{player}"
        cache = self._cache(player)
        if cache is not None:
            address, client = cache
            try:
                cached = await client.get(key)
            except RedisError:
                self.cache_errors.labels(address).inc()
                cached = None
            if cached is not None:
                self.cache_requests.labels("hit").inc()
                return json.loads(cached)
        self.cache_requests.labels("miss").inc()
        row = await self._query(player)
        if cache is not None and row is not None:
            try:
                await client.set(key, json.dumps(row), ex=CACHE_TTL_S)
            except RedisError:
                self.cache_errors.labels(address).inc()
        return row

    async def _query(self, player: int) -> dict | None:
        started = time.perf_counter()
        try:
            rec = await self.db.fetchrow(
                "SELECT p.id, p.name, p.level, count(i.id) AS items, coalesce(sum(i.qty), 0) AS qty"
                " FROM players p LEFT JOIN items i ON i.player_id = p.id WHERE p.id = $1 GROUP BY p.id",
                player,
            )
        finally:
            self.db_queries.inc()
            self.db_duration.observe(time.perf_counter() - started)
        return dict(rec) if rec is not None else None


async def _game(request: web.Request) -> web.Response:
    svc: EdgeService = request.app["svc"]
    started = time.perf_counter()
    code = 200
    try:
        player = int(request.query.get("player", "1"))
        row = await svc.player(player)
        if row is None:
            code = 404
            return web.json_response({"error": "no such player"}, status=404)
        return web.json_response(row)
    except ValueError:
        code = 400
        return web.json_response({"error": "player must be an integer"}, status=400)
    except Exception as exc:  # noqa: BLE001 - the database being down is a 503 the gates must see, not a crash
        code = 503
        return web.json_response({"error": f"backend unavailable: {type(exc).__name__}"}, status=503)
    finally:
        svc.requests.labels(str(code)).inc()
        svc.duration.observe(time.perf_counter() - started)


async def _metrics(request: web.Request) -> web.Response:
    svc: EdgeService = request.app["svc"]
    return web.Response(body=generate_latest(svc.registry), content_type="text/plain", charset="utf-8")


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "cache_nodes": request.app["svc"].nodes})


async def _maintenance(request: web.Request) -> web.Response:
    request.app["svc"].maint_requests.inc()
    return web.Response(status=503, text=MAINTENANCE_PAGE, content_type="text/html", headers={"Retry-After": "30"})


async def serve(args: argparse.Namespace) -> None:
    token = Path(args.consul_token_file).read_text().strip() if args.consul_token_file else None
    svc = EdgeService(dsn=args.dsn, consul=args.consul, consul_token=token, static_nodes=args.redis)
    await svc.start()
    game = web.Application()
    game["svc"] = svc
    game.router.add_get("/play", _game)
    game.router.add_get("/metrics", _metrics)
    game.router.add_get("/healthz", _health)
    maint = web.Application()
    maint["svc"] = svc
    maint.router.add_route("GET", "/{tail:.*}", _maintenance)
    runners = [await serve_app(app, listen, backlog=1024)
               for app, listen in ((game, args.game), (maint, args.maintenance))]
    stop = stop_on_signals()
    print(f"game edge on {args.game}, maintenance page on {args.maintenance}", flush=True)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()
    await svc.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.edge", description=__doc__)
    ap.add_argument("--game", required=True, help="HOST:PORT of the game listener (also /metrics)")
    ap.add_argument("--maintenance", required=True, help="HOST:PORT of the maintenance page")
    ap.add_argument("--dsn", required=True, help="postgresql://user@host:port/db")
    ap.add_argument("--consul", required=True, help="Consul HTTP URL holding the cache placement")
    ap.add_argument("--consul-token-file")
    ap.add_argument("--redis", action="append", default=[], help="HOST:PORT cache node until Consul answers")
    asyncio.run(serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
