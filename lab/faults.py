"""`lab inject NAME`: the drill's fault scenarios, each visible in the metrics the gates read."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx

from lab.edge import SCHEDULING_KEY
from lab.resp import RedisPool
from lab.services import Secrets
from lab.settings import CACHE_HOSTS, LabConfig

__all__ = ["FAULTS", "inject"]


def _consul_headers(cfg: LabConfig) -> dict[str, str]:
    return {"X-Consul-Token": Secrets(cfg).read("consul-token")}


def _post(url: str, body: dict, headers: dict | None = None) -> Any:
    r = httpx.post(url, json=body, headers=headers, timeout=10)
    r.raise_for_status()
    return r.json() if r.content else {}


def consul_contention(cfg: LabConfig, **_: Any) -> Any:
    """Streaming on + heavy background load: KV apply p50 climbs to seconds (coldstart:consul_kvs_apply_p50_ms)."""
    return _post(f"{cfg.consul_url}/_lab/faults", {"fault": "consul-contention"}, _consul_headers(cfg))


def slow_leader(cfg: LabConfig, *, target: str | None = None, **_: Any) -> Any:
    """The leader's disk is slow: leader lastContact and commit time rise, BoltDB freelist grows."""
    body = {"fault": "slow-leader", **({"server": target} if target else {})}
    return _post(f"{cfg.consul_url}/_lab/faults", body, _consul_headers(cfg))


def stale_scheduling_data(cfg: LabConfig, **_: Any) -> Any:
    """Restore a Consul snapshot that holds the cache placement of a cluster that no longer exists.

    Done as a real save/restore: write wrong nodes, snapshot, put the right nodes back,
    restore the snapshot. The edge then reads from nodes that don't answer: cache misses rise
    (coldstart:cache_hit_ratio falls) and the database takes the load.
    """
    headers = _consul_headers(cfg)
    url = f"{cfg.consul_url}/v1/kv/{SCHEDULING_KEY}"
    current = httpx.get(url, params={"raw": "1"}, headers=headers, timeout=5)
    current.raise_for_status()
    # Addresses inside the lab subnet where nothing listens: the old cache nodes.
    stale = [f"{cfg.subnet.network_address + 200 + i}:{cfg.ports.redis}" for i in range(len(CACHE_HOSTS))]
    httpx.put(url, content=json.dumps({"nodes": stale}), headers=headers, timeout=5).raise_for_status()
    snap = httpx.get(f"{cfg.consul_url}/v1/snapshot", headers=headers, timeout=10)
    snap.raise_for_status()
    httpx.put(url, content=current.content, headers=headers, timeout=5).raise_for_status()
    httpx.put(f"{cfg.consul_url}/v1/snapshot", content=snap.content, headers=headers, timeout=30).raise_for_status()
    return {"scheduling_key": SCHEDULING_KEY, "restored_nodes": stale, "correct_nodes": json.loads(current.content)}


def unhealthy_node_eligible(cfg: LabConfig, *, target: str | None = None, **_: Any) -> Any:
    """A cache node stays ready+eligible but every alloc on it fails (coldstart:nomad_eligible_node_failed_allocs_10m)."""
    return _post(f"{cfg.nomad_url}/_lab/faults", {"fault": "unhealthy-node-eligible", "node": target or "cache2"})


def cold_cache(cfg: LabConfig, **_: Any) -> Any:
    """FLUSHALL every cache node: hit ratio drops to 0 and database queries jump until the cache refills."""
    import asyncio

    async def flush() -> dict[str, str]:
        out = {}
        for host in CACHE_HOSTS:
            pool = RedisPool(cfg.ip(host), cfg.ports.redis, size=1, timeout=2)
            try:
                out[host] = str(await pool.execute("FLUSHALL"))
            except Exception as exc:  # one dead node must not stop flushing the others
                out[host] = f"error: {exc}"
            finally:
                await pool.close()
        return out

    return asyncio.run(flush())


def preempted_host(cfg: LabConfig, *, target: str | None = None, notice_s: float | None = None, **_: Any) -> Any:
    """The container host gets a preemption notice; its containers are killed when it runs out
    (coldstart_lab_preemption_notice_seconds counts down, coldstart_lab_containers_running drops)."""
    host = target or cfg.container_host
    body = {"notice_s": notice_s if notice_s is not None else cfg.preempt_notice_s}
    return _post(f"http://{cfg.ip(host)}:{cfg.ports.node_agent}/_lab/preempt", body)


def clear(cfg: LabConfig, **_: Any) -> Any:
    """Clear the Consul and Nomad stand-in faults (data faults need a runbook: that is the drill)."""
    return {
        "consul": _post(f"{cfg.consul_url}/_lab/faults", {"fault": "clear"}, _consul_headers(cfg)),
        "nomad": _post(f"{cfg.nomad_url}/_lab/faults", {"fault": "clear"}),
    }


FAULTS: dict[str, Callable[..., Any]] = {
    "consul-contention": consul_contention,
    "slow-leader": slow_leader,
    "stale-scheduling-data": stale_scheduling_data,
    "unhealthy-node-eligible": unhealthy_node_eligible,
    "cold-cache": cold_cache,
    "preempted-host": preempted_host,
    "clear": clear,
}


def inject(cfg: LabConfig, name: str, **kwargs: Any) -> Any:
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return FAULTS[name](cfg, **kwargs)
