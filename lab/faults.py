"""`lab inject NAME`: the drill's fault scenarios, each visible in the metrics the gates read.

On real agents every fault is made with the operating system and the agents' own APIs (CFS
throttling, real load, a real snapshot restore, a port taken on a host); on the stand-ins through
their fault endpoints.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from lab import cgroups
from lab.agents import CONSUL_CLIENT_HOSTS
from lab.edge import SCHEDULING_KEY
from lab.fault_record import fault_file, forget, recorded, remember
from lab.hosts.processes import pid_alive, start_daemon, stop_daemon
from lab.hosts.shell import LabError
from lab.hosts.state import load_state
from lab.readiness_faults import READINESS_FAULTS, clear_readiness_faults
from lab.services import PY, Secrets, restart_load
from lab.settings import CACHE_HOSTS, CONSUL_HOSTS, LabConfig

__all__ = ["DOWN_TARGETS", "FAULTS", "inject"]


def _consul_headers(cfg: LabConfig) -> dict[str, str]:
    return {"X-Consul-Token": Secrets(cfg).read("consul-token")}


def _post(url: str, body: dict, headers: dict | None = None) -> Any:
    r = httpx.post(url, json=body, headers=headers, timeout=10)
    r.raise_for_status()
    return r.json() if r.content else {}


# Real-agent faults: how hard each one pushes.
SLOW_LEADER_CPU = 0.05  # share of one CPU left to the throttled leader (CFS quota 5 ms per 100 ms)
CONTENTION_FACTOR = 8.0  # the internal services' reconnect storm: this many times their usual rate
CONTENTION_WATCHERS = 300  # blocking queries the services hold on their prefix; each write wakes them all
SQUATTER = "port-squatter"
# The streaming fault, on each Consul client agent: watchers of its services' health (each its own view,
# so one stream each while the agent reads through the streaming backend) and check-status churn.
STREAMING_SERVICES = 40
STREAMING_WATCHERS = 300
STREAMING_CHURN = 40.0  # check status changes a second, per client agent
WATCHERS = "streaming-watchers"
# SO_REUSEADDR: killing redis leaves its connections in TIME_WAIT on the port, which would
# otherwise keep the squatter out until redis (which sets it) is restarted and wins the port.
_SQUAT = ("import socket,sys,time\n"
          "s=socket.socket()\n"
          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "while True:\n"
          "    try:\n        s.bind(('0.0.0.0', int(sys.argv[1]))); break\n"
          "    except OSError: time.sleep(0.05)\n"
          "s.listen(1)\nprint('holding port', sys.argv[1], flush=True)\n"
          "while True: time.sleep(3600)\n")


def _real(cfg: LabConfig, system: str) -> bool:
    """Whether the running lab's `system` is a real agent (as `lab up` recorded it in the inventory)."""
    from lab.lifecycle import recorded_backends

    return (recorded_backends(cfg) or {}).get(system, "stand-in").startswith("real")


def _cgroup(cfg: LabConfig, host: str) -> str:
    return f"coldstart-{cfg.prefix}-{host}"


def _consul_host_of(cfg: LabConfig, address: str) -> str:
    ip = address.rsplit(":", 1)[0]
    for host in CONSUL_HOSTS:
        if cfg.ip(host) == ip:
            return host
    raise LabError(f"Consul leader {address!r} is not one of the lab's servers")



def consul_contention(cfg: LabConfig, **_: Any) -> Any:
    """Heavy load on Consul: KV apply p50 climbs (coldstart:consul_kvs_apply_p50_ms).

    Real agents: the internal services' load at CONTENTION_FACTOR times its rate (KV reads and
    writes, health queries) with CONTENTION_WATCHERS blocking queries on the prefix they write, so
    every write fans out to all of them. Stand-in:
    streaming on plus the stand-in's synthetic background load.
    """
    if not _real(cfg, "consul"):
        return _post(f"{cfg.consul_url}/_lab/faults", {"fault": "consul-contention"}, _consul_headers(cfg))
    rps = cfg.internal_rps * CONTENTION_FACTOR
    pids = restart_load(cfg, players_rps=cfg.players_rps, internal_rps=rps, duration=cfg.load_duration_s,
                        clients=cfg.players_clients, watchers=CONTENTION_WATCHERS)
    remember(cfg, "contention", {"internal_rps": rps, "watchers": CONTENTION_WATCHERS})
    return {"internal_rps": rps, "baseline_rps": cfg.internal_rps, "watchers": CONTENTION_WATCHERS, "pids": pids}


def consul_streaming(cfg: LabConfig, **_: Any) -> Any:
    """Streaming under read and write load, shaped like the outage's: on each Consul client agent,
    STREAMING_WATCHERS blocking watchers of its services' health (one stream each while the agent
    uses the streaming backend) while STREAMING_CHURN check changes a second fan out to them. After
    consul.agents.streaming turns it off the same watchers are blocking queries: the load stays.
    Consul 1.22 at this scale is not slowed by it (bench/streaming_fault.py).

    Real agents only: the stand-in models streaming with its KV flag (consul-contention).
    """
    if not _real(cfg, "consul"):
        raise LabError("consul-streaming needs the real Consul agents; the stand-in models streaming in "
                       "consul-contention")
    token = str(Secrets(cfg).file("consul-token"))
    pids = {}
    for host in CONSUL_CLIENT_HOSTS:
        argv = [PY, "-m", "lab.streaming_watchers", "--agent", cfg.url(host, cfg.ports.consul_http),
                "--token-file", token, "--services", str(STREAMING_SERVICES), "--watchers", str(STREAMING_WATCHERS),
                "--churn", str(STREAMING_CHURN), "--duration", str(cfg.load_duration_s)]
        pids[host] = start_daemon(cfg.spec, host, WATCHERS, argv).pid
    shape = {"services": STREAMING_SERVICES, "watchers": STREAMING_WATCHERS, "churn_per_s": STREAMING_CHURN}
    remember(cfg, "streaming", shape)
    return {**shape, "agents": list(CONSUL_CLIENT_HOSTS), "pids": pids}


def _make_leader(cfg: LabConfig, host: str, timeout: float = 15.0) -> None:
    headers = _consul_headers(cfg)
    raft = httpx.get(f"{cfg.consul_url}/v1/operator/raft/configuration", headers=headers, timeout=5)
    server = next((s for s in raft.raise_for_status().json()["Servers"] if s["Node"] == host), None)
    if server is None:
        raise LabError(f"{host} is not in the Raft configuration")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.post(f"{cfg.consul_url}/v1/operator/raft/transfer-leader", params={"id": server["ID"]},
                       headers=headers, timeout=10)
        leader = httpx.get(f"{cfg.consul_url}/v1/status/leader", timeout=5).json()
        if leader and _consul_host_of(cfg, leader) == host:
            return
        time.sleep(0.5 if r.status_code < 500 else 1.0)
    raise LabError(f"could not move Consul leadership to {host} within {timeout:.0f}s")


def slow_leader(cfg: LabConfig, *, target: str | None = None, **_: Any) -> Any:
    """The leader is starved: leader lastContact, commit time and KV apply latency rise.

    Real agents: the server's process is put in a cgroup with a CFS quota of SLOW_LEADER_CPU of
    one CPU (real throttling: cpu.stat nr_throttled/nr_periods, exported by the lab's cgroup
    exporter). Stand-in: its slow-disk model.
    """
    if not _real(cfg, "consul"):
        body = {"fault": "slow-leader", **({"server": target} if target else {})}
        return _post(f"{cfg.consul_url}/_lab/faults", body, _consul_headers(cfg))
    leader = _consul_host_of(cfg, httpx.get(f"{cfg.consul_url}/v1/status/leader", timeout=5)
                             .raise_for_status().json())
    target = target or leader
    if target not in CONSUL_HOSTS:
        raise LabError(f"slow-leader target must be one of {CONSUL_HOSTS}, not {target!r}")
    if target != leader:
        _make_leader(cfg, target)  # the scenario is a slow *leader*: hand it leadership first
    record = load_state(cfg.state_dir).daemons.get(f"{target}/consul")
    if record is None or not pid_alive(record.pid, record.starttime):
        raise LabError(f"no running Consul agent on {target}")
    group = cgroups.throttle(_cgroup(cfg, target), [record.pid], SLOW_LEADER_CPU)
    return {"server": target, "pid": record.pid, "cgroup": str(group), "cpu_fraction": SLOW_LEADER_CPU}


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


def _netns_pids(cfg: LabConfig, host: str) -> list[int]:
    from lab.hosts.shell import sh

    return [int(p) for p in sh(["ip", "netns", "pids", cfg.spec.netns(host)], check=False).stdout.split()]


def unhealthy_node_eligible(cfg: LabConfig, *, target: str | None = None, **_: Any) -> Any:
    """A cache node stays ready+eligible but every alloc on it fails (coldstart:nomad_eligible_node_failed_allocs_10m).

    Real agents: another process takes the cache's static port on that host and the running
    redis is killed; Nomad restarts it, it cannot bind, and the allocation fails once its
    restart attempts are spent, while the node still reports ready and eligible.
    """
    node = target or "cache2"
    if not _real(cfg, "nomad"):
        return _post(f"{cfg.nomad_url}/_lab/faults", {"fault": "unhealthy-node-eligible", "node": node})
    if node not in CACHE_HOSTS:
        raise LabError(f"unhealthy-node-eligible target must be one of {CACHE_HOSTS}, not {node!r}")
    squatter = start_daemon(cfg.spec, node, SQUATTER, [PY, "-c", _SQUAT, str(cfg.ports.redis)])
    killed = []
    for pid in _netns_pids(cfg, node):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "redis-server":
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ProcessLookupError):
            pass
    deadline = time.monotonic() + 10
    while "holding port" not in Path(squatter.log).read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"node": node, "port": cfg.ports.redis, "squatter_pid": squatter.pid, "killed_redis": killed}


def cold_cache(cfg: LabConfig, **_: Any) -> Any:
    """FLUSHALL every cache node: hit ratio drops to 0 and database queries jump until the cache refills."""
    out = {}
    for host in CACHE_HOSTS:
        # One try per node: a dead node is reported, not waited for.
        client = redis.Redis(cfg.ip(host), cfg.ports.redis, socket_timeout=2, socket_connect_timeout=2,
                             retry=Retry(NoBackoff(), 0))
        try:
            client.flushall()
            out[host] = "OK"
        except Exception as exc:  # noqa: BLE001 - one dead node must not stop flushing the others
            out[host] = f"error: {exc}"
        finally:
            client.close()
    return out


def preempted_host(cfg: LabConfig, *, target: str | None = None, notice_s: float | None = None, **_: Any) -> Any:
    """The container host gets a preemption notice, as the cloud's metadata endpoint serves it
    (coldstart_host_preemption_deadline_timestamp_seconds is set, HostPreemptionNotice fires and the
    trigger starts the drain); whatever still runs at the deadline is killed."""
    host = target or cfg.container_host
    body = {"notice_s": notice_s if notice_s is not None else cfg.preempt_notice_s}
    return _post(f"http://{cfg.ip(host)}:{cfg.ports.node_agent}/_lab/preempt", body)


# ---- a whole system going away (failure drills) ---------------------------------------------------
# Prometheus and PowerDNS keep their data on disk (TSDB, the zone's SQLite), so "down" is the real
# thing: the process is stopped and `service-up` starts it again with the same command line. Vault
# runs in dev mode (in memory: a restart would lose its secrets and AppRole), so "down" closes its
# port with a TCP reset in its host's firewall: to a client exactly a stopped server (connection
# refused), and nothing is lost when it comes back.
DOWN_TARGETS = {"prometheus": ("prom", "prometheus"), "dns": ("dns", "pdns"), "vault": ("vault", None)}
_DOWN_COMMENT = "coldstart-fault-down"
def _down_target(target: str | None) -> tuple[str, str | None]:
    if target not in DOWN_TARGETS:
        raise LabError(f"service-down/up target must be one of {', '.join(DOWN_TARGETS)}, not {target!r}")
    return DOWN_TARGETS[target]


def _vault_rule(cfg: LabConfig, op: str) -> list[str]:
    return ["ip", "netns", "exec", cfg.spec.netns("vault"), "iptables", op, "INPUT", "-p", "tcp", "--dport",
            str(cfg.ports.vault_http), "-m", "comment", "--comment", _DOWN_COMMENT, "-j", "REJECT",
            "--reject-with", "tcp-reset"]


def service_down(cfg: LabConfig, *, target: str | None = None, **_: Any) -> Any:
    """Take a whole system away: `prometheus` or `dns` (PowerDNS) stopped, `vault` refusing connections."""
    from lab.hosts.shell import sh

    host, name = _down_target(target)
    if name is None:
        if sh(_vault_rule(cfg, "-C"), check=False).returncode != 0:
            sh(_vault_rule(cfg, "-I"))
        remember(cfg, f"down:{target}", {"host": host, "firewall": True})
        return {"target": target, "how": "port closed (TCP reset)", "port": cfg.ports.vault_http}
    record = load_state(cfg.state_dir).daemons.get(f"{host}/{name}")
    remembered = recorded(cfg).get(f"down:{target}")
    if record is None:
        if remembered:
            return {"target": target, "how": "already stopped"}
        raise LabError(f"no {name} daemon recorded on {host}")
    # Remember how to start it again before stopping it: a crash in between still leaves the recipe.
    remember(cfg, f"down:{target}", {"host": host, "name": name, "argv": record.argv})
    stopped = stop_daemon(cfg.spec, host, name)
    return {"target": target, "how": "process stopped", "pid": record.pid, "was_running": stopped}


def service_up(cfg: LabConfig, *, target: str | None = None, timeout: float = 30.0, **_: Any) -> Any:
    """Bring back what `service-down` took away, and wait until it answers."""
    from lab.agents import poll_until
    from lab.hosts.processes import wait_for_port
    from lab.hosts.shell import sh

    host, name = _down_target(target)
    down = recorded(cfg).get(f"down:{target}")
    if name is None:
        removed = 0
        while sh(_vault_rule(cfg, "-D"), check=False).returncode == 0:
            removed += 1
        out: dict[str, Any] = {"target": target, "rules_removed": removed}
        poll_until("vault", lambda: httpx.get(f"{cfg.vault_url}/v1/sys/health", timeout=1).status_code == 200, timeout)
    else:
        if down is None:
            return {"target": target, "how": "was not down"}
        record = start_daemon(cfg.spec, host, name, down["argv"])
        port = cfg.ports.prometheus if target == "prometheus" else cfg.ports.dns
        wait_for_port(cfg.ip(host), port, timeout=timeout, pid=record.pid)
        if target == "prometheus":
            poll_until("prometheus", lambda: httpx.get(f"{cfg.prometheus_url}/-/ready", timeout=1).status_code == 200,
                       timeout, record)
        out = {"target": target, "pid": record.pid}
    forget(cfg, f"down:{target}")
    return out


def _players_dns_rule(cfg: LabConfig, op: str) -> list[str]:
    return ["ip", "netns", "exec", cfg.spec.netns("dns"), "iptables", op, "INPUT", "-p", "udp", "--dport",
            str(cfg.ports.dns), "-s", cfg.ip("players"), "-m", "comment", "--comment", _DOWN_COMMENT, "-j", "DROP"]


def players_dns_lost(cfg: LabConfig, **_: Any) -> Any:
    """The players lose their path to DNS (their UDP queries to the authoritative server are dropped):
    no player resolves the game, coldstart:players_admitted_error_points jumps to the target percent.
    The steering record itself, and reading it back (AXFR over TCP), are untouched."""
    from lab.hosts.shell import sh

    if sh(_players_dns_rule(cfg, "-C"), check=False).returncode != 0:
        sh(_players_dns_rule(cfg, "-I"))
    remember(cfg, "players-dns-lost", True)
    return {"dropped": f"udp {cfg.ip('players')} -> {cfg.dns_server}"}


def clear(cfg: LabConfig, **_: Any) -> Any:
    """Clear the process-level faults (data faults need a runbook: that is the drill)."""
    from lab.hosts.shell import sh

    out: dict[str, Any] = clear_readiness_faults(cfg)

    while sh(_players_dns_rule(cfg, "-D"), check=False).returncode == 0:
        out["players_dns"] = "restored"
    for key in [k for k in recorded(cfg) if k.startswith("down:")]:
        out[key.replace("down:", "up:")] = service_up(cfg, target=key.split(":", 1)[1])
    if _real(cfg, "consul"):
        out["unthrottled"] = [g for g in cgroups.groups(f"coldstart-{cfg.prefix}-")
                              if cgroups.throttle(g, [], None)]
        out["streaming_watchers"] = [h for h in CONSUL_CLIENT_HOSTS if stop_daemon(cfg.spec, h, WATCHERS)]
        if "contention" in recorded(cfg):
            out["load"] = restart_load(cfg, players_rps=cfg.players_rps, internal_rps=cfg.internal_rps,
                                       duration=cfg.load_duration_s, clients=cfg.players_clients)
        fault_file(cfg).unlink(missing_ok=True)
    else:
        out["consul"] = _post(f"{cfg.consul_url}/_lab/faults", {"fault": "clear"}, _consul_headers(cfg))
    if _real(cfg, "nomad"):
        out["squatters"] = [h for h in CACHE_HOSTS if stop_daemon(cfg.spec, h, SQUATTER)]
    else:
        out["nomad"] = _post(f"{cfg.nomad_url}/_lab/faults", {"fault": "clear"})
    return out


FAULTS: dict[str, Callable[..., Any]] = {
    "consul-contention": consul_contention,
    "consul-streaming": consul_streaming,
    "slow-leader": slow_leader,
    "stale-scheduling-data": stale_scheduling_data,
    "unhealthy-node-eligible": unhealthy_node_eligible,
    "cold-cache": cold_cache,
    "preempted-host": preempted_host,
    "players-dns-lost": players_dns_lost,
    "service-down": service_down,
    "service-up": service_up,
    **READINESS_FAULTS,
    "clear": clear,
}


def inject(cfg: LabConfig, name: str, **kwargs: Any) -> Any:
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return FAULTS[name](cfg, **kwargs)
