"""The cache warm-up: hot keys read from PostgreSQL into Redis nodes with SET NX, at a bounded rate."""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any

import asyncpg
from redis.asyncio import Redis
from redis.exceptions import RedisError

from activities._clients import heartbeat, resume_details, secret_of, unavailable
from activities.binding import implements, invalid_argument
from activities.contracts.cache import WARM, WarmInput, WarmOutput

__all__ = ["warm"]

# SQLSTATE classes of a wrong query: data exception, invalid transaction state (a write in the read-only
# transaction), syntax error or access rule violation.
_QUERY_ERRORS = ("22", "25", "42")


async def _hot_rows(inp: WarmInput) -> list[tuple[str, str, str]]:
    """(shard, key, value) of the first max_keys rows, read in a read-only transaction."""
    try:
        # The mode is passed, not left to asyncpg: its default (prefer, or $PGSSLMODE) takes plaintext silently.
        conn = await asyncpg.connect(inp.dsn, password=await asyncio.to_thread(secret_of, inp.password), timeout=10,
                                     ssl=inp.sslmode)
    except asyncpg.ClientConfigurationError as exc:
        # The worker's TLS setup (no CA file for verify-full, say): a retry cannot change it.
        raise invalid_argument(f"database {inp.dsn} (sslmode {inp.sslmode}): "
                               f"{exc.args[0] if exc.args else exc}") from None
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise unavailable(f"database {inp.dsn} (sslmode {inp.sslmode}): {exc}") from None
    try:
        async with conn.transaction(readonly=True):
            rows = []
            async for row in conn.cursor(inp.query, prefetch=min(inp.max_keys, 1000)):
                if "key" not in row or "value" not in row:
                    raise invalid_argument(f"the query must return `key` and `value` columns, not {list(row.keys())}")
                key, value = str(row["key"]), str(row["value"])
                rows.append((str(row["shard"]) if "shard" in row else key, key, value))
                if len(rows) >= inp.max_keys:
                    break
            return rows
    except asyncpg.PostgresError as exc:
        # Syntax, access, data and read-only errors are the query's: retrying cannot help.
        if str(getattr(exc, "sqlstate", ""))[:2] in _QUERY_ERRORS:
            raise invalid_argument(f"the hot-key query: {exc}") from None
        raise unavailable(f"the hot-key query: {exc}") from None
    finally:
        await conn.close()


def _placed(inp: WarmInput, shard: str) -> list[str]:
    if inp.placement == "all":
        return list(inp.nodes)
    # crc32 over the shard text, modulo the node count: the placement the clients compute.
    return [inp.nodes[zlib.crc32(shard.encode()) % len(inp.nodes)]]


@implements(WARM)
async def warm(inp: WarmInput) -> WarmOutput:
    started = time.monotonic()
    rows = await _hot_rows(inp)
    done = resume_details()
    first = int(done.get("next", 0)) if isinstance(done, dict) else 0
    written = int(done.get("written", 0)) if isinstance(done, dict) else 0
    present = int(done.get("present", 0)) if isinstance(done, dict) else 0
    per_node: dict[str, int] = {node: 0 for node in inp.nodes}
    if isinstance(done, dict):
        per_node.update({k: int(v) for k, v in (done.get("per_node") or {}).items() if k in per_node})
    clients = {node: Redis(host=node.rpartition(":")[0].strip("[]"), port=int(node.rpartition(":")[2]),
                           socket_timeout=5, socket_connect_timeout=5) for node in inp.nodes}
    try:
        for at in range(first, len(rows), inp.batch):
            batch_started = time.monotonic()
            chunk = rows[at:at + inp.batch]
            by_node: dict[str, list[tuple[str, str]]] = {}
            for shard, key, value in chunk:
                for node in _placed(inp, shard):
                    by_node.setdefault(node, []).append((key, value))
            for node, items in by_node.items():
                results = await _set_missing(clients[node], node, items, inp.ttl_seconds)
                set_now = sum(1 for r in results if r)
                written += set_now
                present += len(results) - set_now
                per_node[node] += set_now
            heartbeat({"next": at + len(chunk), "written": written, "present": present, "per_node": per_node})
            # The rate bound: a batch of n keys takes at least n / rate seconds.
            await asyncio.sleep(max(0.0, len(chunk) / inp.rate - (time.monotonic() - batch_started)))
    finally:
        for client in clients.values():
            await client.aclose()
    return WarmOutput(keys_read=len(rows), written=written, already_present=present, per_node=per_node,
                      seconds=round(time.monotonic() - started, 3))


async def _set_missing(client: Redis, node: str, items: list[tuple[str, str]], ttl: int | None) -> list[Any]:
    """SET NX each key in one pipeline: True where it was set, None where the node already held it."""
    try:
        async with client.pipeline(transaction=False) as pipe:
            for key, value in items:
                pipe.set(key, value, nx=True, ex=ttl)
            return await pipe.execute()
    except (RedisError, OSError) as exc:
        raise unavailable(f"cache node {node}: {exc}") from None
