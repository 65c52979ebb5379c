"""`lab up` / `lab down` / `lab status`: build the whole drill platform in order, write the inventory, remove it all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from activities._clients import ConsulTarget, NomadTarget
from activities.consul.agent_hosts import ConsulAgentHost
from activities.executors import HostTarget, ShellAccess
from activities.inventory import DnsSteering, Endpoints, Host, Inventory, Telemetry, VaultLogin
from activities.secrets import VaultSecretRef
from lab.agents import (
    CONSUL_CLIENT_HOSTS,
    consul_agent_dir,
    consul_restart_argv,
    poll_until,
    start_consul,
    start_nomad,
    start_vault,
    wait_ready,
)
from lab.containers import remove_sessions_cgroup, sessions_cgroup
from lab.hashistack import Backends, backends
from lab.hosts import create, destroy, leftovers, netns_usable, setup_ssh, ssh_target
from lab.hosts.processes import pid_alive, start_daemon, wait_for_port
from lab.hosts.shell import LabError, sh
from lab.hosts.state import load_state
from lab.hosts.tenancy import OWNER_FILE, occupant, record_owner
from lab.identity import identity_facts
from lab.inventory import write_inventory
from lab.services import (
    STEER_NAME,
    STEER_ZONE,
    Secrets,
    edge_argv,
    internal_argv,
    node_agent_argv,
    players_argv,
    redis_args,
    session_router_argv,
    standin_reload_argv,
)
from lab.settings import CACHE_HOSTS, CONSUL_HOSTS, LabConfig
from lab.telemetry_stack import render_in_place
from lab.users import register_users, user_services, write_users_file
from workflows.loader import read_inventory
from workflows.yaml_safety import load_file

__all__ = ["CONFIG", "MANIFEST", "build_inventory", "claim", "down", "recorded_backends", "saved_config", "status", "up"]

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "lab-files.json"
CONFIG = "lab-config.json"  # the settings `up` used, so inject/load/status/down see the same ports
# The lab's own daemons import and connect all at once on a loaded 2-core host (15 s failed a CI run);
# a daemon that dies still fails the wait at once.
_DAEMON_START_S = 60.0
# The lab's cache job, the KV prefix its placement lives under, and the hot rows of the lab's game database
# (key, shard, value; keyed and sharded as the game edge reads them): the cold-start runbook's inventory facts.
COLD_START_FACTS = {
    "cache_job": "cache",
    "cache_port_label": "redis",
    "cache_scheduling_prefix": "coldstart/cache/scheduling",
    "cache_warm_query": (
        "SELECT 'player:' || p.id AS key, p.id::text AS shard, json_build_object('id', p.id, 'name', p.name, "
        "'level', p.level, 'items', count(i.id), 'qty', coalesce(sum(i.qty), 0))::text AS value "
        "FROM players p LEFT JOIN items i ON i.player_id = p.id GROUP BY p.id ORDER BY p.id"),
}

# What `down` deletes from the state dir; logs/ stays for the post-mortem (documented).
STATE_SUBDIRS = ("secrets", "consul", "nomad", "vault", "dns", "prometheus", "postgres", "snapshots", "users",
                 "sessions", "alertmanager", "pulumi", "forensics")
KV_SECRETS = {
    "dns_tsig": ("coldstart/dns-tsig", "secret"),
    "consul_token": ("coldstart/consul", "token"),
    "nomad_token": ("coldstart/nomad", "token"),
}


def _env() -> None:
    # Daemons run `python -m lab.*`; make that work whatever the caller's cwd is.
    parts = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))


def _write_manifest(cfg: LabConfig) -> None:
    data = {"inventory": str(Path(cfg.inventory_path).resolve()), "subdirs": list(STATE_SUBDIRS)}
    cfg.path(MANIFEST).write_text(json.dumps(data))


# ---- pieces of `up` --------------------------------------------------------------------------
def _maintenance_address(cfg: LabConfig) -> None:
    ns = cfg.spec.netns("edge")
    sh(["ip", "netns", "exec", ns, "ip", "addr", "replace", f"{cfg.maint_ip}/{cfg.subnet.prefixlen}", "dev", "eth0"])


def _dns(cfg: LabConfig):
    from lab.dns import PdnsPaths, PdnsSettings, prepare
    from lab.dns.server import PdnsLab

    settings = PdnsSettings(
        zone=STEER_ZONE, steering_names=(STEER_NAME,), game_ip=cfg.ip("edge"), maint_ip=cfg.maint_ip,
        start_percent=0, bind_address=cfg.ip("dns"), port=cfg.ports.dns,
        axfr_from=(str(cfg.subnet), "127.0.0.0/8"),
        # pdns' built-in webserver serves /metrics in Prometheus format; only the lab may ask.
        extra={"webserver": "yes", "webserver-address": cfg.ip("dns"), "webserver-port": str(cfg.ports.pdns_web),
               "webserver-allow-from": str(cfg.subnet)},
    )
    dns_dir = cfg.path("dns")
    paths = PdnsPaths(dns_dir)
    if paths.database.exists():
        lab = PdnsLab(settings=settings, paths=paths)  # keep the zone: steering may have moved
        paths.conf.write_text(lab.launch().conf_text)
        return lab, None
    lab = prepare(dns_dir, settings)
    return lab, lab.key


def _seed_vault(cfg: LabConfig, sec: Secrets, tsig: Any) -> None:
    headers = {"X-Vault-Token": sec.read("vault-root-token")}
    values = {"consul_token": {"token": sec.read("consul-token")}, "nomad_token": {"token": sec.read("nomad-token")}}
    if tsig is not None:
        values["dns_tsig"] = tsig.as_dict()
    for key, data in values.items():
        path, _ = KV_SECRETS[key]
        r = httpx.post(f"{cfg.vault_url}/v1/secret/data/{path}", json={"data": data}, headers=headers, timeout=5)
        r.raise_for_status()


def _register_cache_job(cfg: LabConfig) -> None:
    import nomad

    job = {
        # A system job: one redis on every eligible cache node, on a static port the edge is told about.
        "ID": "cache", "Name": "cache", "Type": "system", "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "redis", "Count": 1,
            "Networks": [{"ReservedPorts": [{"Label": "redis", "Value": cfg.ports.redis}]}],
            # A redis that cannot start fails its allocation within seconds instead of Nomad's default
            # 2 x 15 s of restarts: the unhealthy-node fault shows quickly in the drill.
            "RestartPolicy": {"Attempts": 3, "Interval": 300_000_000_000, "Delay": 2_000_000_000, "Mode": "fail"},
            "Tasks": [{"Name": "redis", "Driver": "raw_exec",
                       "Config": {"command": shutil.which("redis-server") or "/usr/bin/redis-server",
                                  "args": redis_args(cfg)}}],
        }],
    }
    client = nomad.Nomad(host=cfg.ip("nomad"), port=cfg.ports.nomad_http, timeout=5)
    client.job.register_job("cache", {"Job": job})


def _scheduling_kv(cfg: LabConfig, sec: Secrets) -> None:
    headers = {"X-Consul-Token": sec.read("consul-token")}
    nodes = [f"{cfg.ip(h)}:{cfg.ports.redis}" for h in CACHE_HOSTS]
    from lab.edge import SCHEDULING_KEY

    r = httpx.put(f"{cfg.consul_url}/v1/kv/{SCHEDULING_KEY}", content=json.dumps({"nodes": nodes}),
                  headers=headers, timeout=5)
    r.raise_for_status()


def _baseline_snapshot(cfg: LabConfig, sec: Secrets) -> Path:
    """The lab's backup job: a healthy snapshot in the store, so a cold start has something to restore."""
    store = cfg.path("snapshots")
    store.mkdir(parents=True, exist_ok=True)
    existing = sorted(store.glob("*.snap"))
    if existing:
        return existing[-1]
    response = httpx.get(f"{cfg.consul_url}/v1/snapshot", headers={"X-Consul-Token": sec.read("consul-token")}, timeout=30)
    response.raise_for_status()
    path = store / f"baseline-{int(time.time())}.snap"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(response.content)
    os.replace(tmp, path)
    return path


def _consul_telemetry(cfg: LabConfig, consul: list) -> None:
    """Each Consul server in a cgroup of its own (no limit yet) with its CFS stats exported from the prom host
    (the slow-leader fault only sets a quota; the throttled share is there before and after), and a KV
    canary writing from the prom host (let through a client block) so write latency is always measured."""
    from lab import cgroups
    from lab.services import PY

    for record in consul:
        group = f"coldstart-{cfg.prefix}-{record.host}"
        # A re-run of `up` leaves a placed server (and any slow-leader quota on it) as it is.
        if record.host in CONSUL_HOSTS and record.pid not in cgroups.pids(group):
            cgroups.throttle(group, [record.pid], None)
    exporter = start_daemon(cfg.spec, "prom", "cgroup-exporter", [
        PY, "-m", "lab.cgroup_exporter", "--listen", f"{cfg.ip('prom')}:{cfg.ports.cgroup_exporter}",
        "--prefix", f"coldstart-{cfg.prefix}-"], host_sysfs=True)
    wait_for_port(cfg.ip("prom"), cfg.ports.cgroup_exporter, timeout=_DAEMON_START_S, pid=exporter.pid, log=exporter.log)
    canary = [PY, "-m", "lab.consul_canary", "--token-file", str(Secrets(cfg).file("consul-token")),
              "--duration", str(cfg.load_duration_s)]
    for host in CONSUL_HOSTS:
        canary += ["--consul", cfg.url(host, cfg.ports.consul_http)]
    start_daemon(cfg.spec, "prom", "consul-canary", canary)


def _alertmanager(cfg: LabConfig, sec: Secrets):
    """Debian's Alertmanager on the telemetry host, sending the preemption alert to coldstart's trigger."""
    from lab.alerting import alertmanager_argv, alertmanager_config

    am_dir = cfg.path("alertmanager")
    am_dir.mkdir(parents=True, exist_ok=True)
    conf = am_dir / "alertmanager.yml"
    conf.write_text(alertmanager_config(f"http://{cfg.spec.gateway}:{cfg.ports.trigger}/alerts",
                                        sec.file("trigger-token")))
    argv = alertmanager_argv("/usr/bin/prometheus-alertmanager", conf, am_dir / "data",
                             f"{cfg.ip('prom')}:{cfg.ports.alertmanager}")
    return start_daemon(cfg.spec, "prom", "alertmanager", argv)


def claim(cfg: LabConfig) -> None:
    """`up`'s first act: make the prefix's namespaces this lab's. Sweep a lab whose owner ended without taking it
    down (a killed test session); refuse one that someone still runs (its daemons would clash with ours)."""
    other = occupant(cfg.spec)
    if other is None:
        return
    if not other.abandoned:
        raise LabError(f"lab {cfg.prefix} is already up from another state dir: {other.describe()}; take it down "
                       f"with `coldstart lab down --state-dir {other.state_dir}`, or use another prefix")
    down(saved_config(other.state_dir) or cfg.model_copy(update={"state_dir": other.state_dir}))


def up(cfg: LabConfig, *, owned: bool = True) -> dict[str, Any]:
    """Create or complete the lab; safe to run again (running pieces are kept).

    owned: this process takes the lab down when it is done (tests, drills, benches); a lab it leaves up after
    ending is swept by the next `up` on the same prefix. False for a lab left up on purpose (`coldstart lab up`)."""
    if reason := netns_usable():
        raise LabError(f"cannot run the lab: {reason}")
    from lab.postgres import initdb, postgres_argv, seed

    _env()
    t0 = time.monotonic()
    spec = cfg.spec
    claim(cfg)
    cfg.path().mkdir(parents=True, exist_ok=True)
    record_owner(cfg.path(), os.getpid() if owned else None)
    _write_manifest(cfg)  # before anything else: a crash from here on is still cleaned by `down`
    create(spec)
    _write_manifest(cfg)
    cfg.path(CONFIG).write_text(cfg.model_dump_json())  # create() may have started from an empty dir
    setup_ssh(spec)
    _maintenance_address(cfg)
    sec = Secrets(cfg)
    sec.ensure()
    for host in spec.ssh_hosts:
        start_daemon(spec, host, "sshd", ["/usr/sbin/sshd", "-D", "-e", "-f",
                                          str(cfg.path("ssh", host, "sshd_config"))])
    # Launch everything that has no dependency at once, then wait.
    found = backends()
    consul = start_consul(cfg, sec, found)
    nomad_d = start_nomad(cfg, sec, found)
    vault = start_vault(cfg, sec, found)
    dns_lab, tsig = _dns(cfg)
    pdns = start_daemon(spec, "dns", "pdns", dns_lab.launch().argv)
    pg_dir = cfg.path("postgres", "data")
    initdb(pg_dir, str(cfg.subnet))
    pg = start_daemon(spec, cfg.db_host, "postgres", postgres_argv(pg_dir, cfg.ip(cfg.db_host), cfg.ports.postgres))
    prom_conf = render_in_place(cfg, sec, found)
    prom_args = ["/usr/bin/prometheus", f"--config.file={prom_conf}",
                 f"--storage.tsdb.path={cfg.path('prometheus', 'data')}",
                 f"--web.listen-address={cfg.ip('prom')}:{cfg.ports.prometheus}",
                 "--storage.tsdb.retention.time=1d", "--web.enable-lifecycle"]
    old = load_state(cfg.state_dir).daemons.get("prom/prometheus")
    prom = start_daemon(spec, "prom", "prometheus", prom_args)
    if old is not None and old.pid == prom.pid:
        os.kill(prom.pid, signal.SIGHUP)  # already running: pick up a re-rendered config

    for host in spec.ssh_hosts:
        wait_for_port(str(spec.address(host)), 22, timeout=10)
    wait_ready(cfg, sec, found, consul, nomad_d, vault)
    if found.consul:
        _consul_telemetry(cfg, consul)
    _seed_vault(cfg, sec, tsig)
    if tsig is not None:
        dns_lab.paths.key.unlink(missing_ok=True)  # the secret now lives in Vault (and pdns' db) only
    _register_cache_job(cfg)
    _scheduling_kv(cfg, sec)
    register_users(cfg, sec.read("consul-token"))
    write_users_file(cfg)
    _baseline_snapshot(cfg, sec)
    wait_for_port(cfg.ip(cfg.db_host), cfg.ports.postgres, timeout=20, pid=pg.pid)
    added = seed(f"postgresql://postgres@{cfg.ip(cfg.db_host)}:{cfg.ports.postgres}/postgres", cfg.seed_players)
    for host in CACHE_HOSTS:
        wait_for_port(cfg.ip(host), cfg.ports.redis, timeout=15)

    edge = start_daemon(spec, "edge", "edge", edge_argv(cfg, sec))
    # Node agents keep the machine's sysfs: their session containers get cgroups of their own.
    agents = [start_daemon(spec, h, "node-agent", node_agent_argv(cfg, h), host_sysfs=True) for h in CACHE_HOSTS]
    router = start_daemon(spec, "edge", "session-router", session_router_argv(cfg))
    alertmanager = _alertmanager(cfg, sec)
    players = start_daemon(spec, "players", "players",
                           players_argv(cfg, cfg.players_rps, cfg.load_duration_s, cfg.players_clients))
    internal = start_daemon(spec, "internal", "internal-load",
                            internal_argv(cfg, sec, cfg.internal_rps, cfg.load_duration_s))
    from lab.dns import wait_until_answering

    wait_until_answering(dns_lab, timeout=15)
    for address, port, daemon in ((cfg.ip("edge"), cfg.ports.edge_http, edge),
                                  (cfg.maint_ip, cfg.ports.edge_http, edge),
                                  *((cfg.ip(h), cfg.ports.node_agent, a) for h, a in zip(CACHE_HOSTS, agents, strict=True)),
                                  (cfg.ip("players"), cfg.ports.players_metrics, players),
                                  (cfg.ip("edge"), cfg.ports.session_router, router),
                                  (cfg.ip("prom"), cfg.ports.alertmanager, alertmanager),
                                  (cfg.ip("internal"), cfg.ports.internal_metrics, internal)):
        wait_for_port(address, port, timeout=_DAEMON_START_S, pid=daemon.pid, log=daemon.log)
    poll_until("Prometheus", lambda: httpx.get(f"{cfg.prometheus_url}/-/ready", timeout=1.0).status_code < 500, 20)
    if not pid_alive(pdns.pid):
        raise LabError(f"pdns exited; see {pdns.log}")

    inventory = build_inventory(cfg, sec, found)
    path = write_inventory(inventory, cfg.inventory_path)
    info = {
        "seconds": round(time.monotonic() - t0, 2),
        "inventory": str(path.resolve()),
        "state_dir": str(cfg.path()),
        "players_seeded": added,
        "prometheus": cfg.prometheus_url,
        "consul": [cfg.url(h, cfg.ports.consul_http) for h in CONSUL_HOSTS],
        "nomad": cfg.nomad_url,
        "vault": cfg.vault_url,
        "dns": cfg.dns_server,
        "game": f"http://{cfg.ip('edge')}:{cfg.ports.edge_http}",
        "maintenance": f"http://{cfg.maint_ip}:{cfg.ports.edge_http}",
        "postgres": f"{cfg.ip(cfg.db_host)}:{cfg.ports.postgres}",
        "ssh": [f"root@{spec.address(h)} (key {cfg.path('ssh', 'client_ed25519')})" for h in spec.ssh_hosts],
        "backends": found.describe(),
    }
    return info


def build_inventory(cfg: LabConfig, sec: Secrets, found: Backends) -> Inventory:
    spec = cfg.spec
    roles = {h: [h.rstrip("0123456789")] for h in spec.hosts}
    roles.update({h: ["consul-server"] for h in CONSUL_HOSTS})
    roles.update({h: ["cache", "nomad-client"] for h in CACHE_HOSTS})
    roles[cfg.container_host].append("containers")
    roles["db"] = ["database"]
    hosts: dict[str, Host] = {}
    for name in spec.hosts:
        if name in spec.ssh_hosts:
            t = ssh_target(spec, name)
            ex = ShellAccess(kind="ssh", address=t.address, port=t.port, user=t.user, key_path=t.key_path,
                             known_hosts=t.known_hosts, python=sys.executable)
        else:
            ex = ShellAccess(kind="netns", netns=spec.netns(name), python=sys.executable)
        hosts[name] = Host(address=cfg.ip(name), roles=roles[name], executor=ex)
    # ACL tokens are reused by a worker for 30 s (a fan-out over every service would otherwise read Vault per
    # service); the TSIG key is read per use, so a DNS step fails closed while Vault is down.
    secret_refs = {k: VaultSecretRef(address=cfg.vault_url, path=p, field=f, cache_seconds=30 if k.endswith("_token") else 0)
                   for k, (p, f) in KV_SECRETS.items()}
    p = cfg.ports
    return Inventory(
        name="lab", drill=True,
        description=f"coldstart drill lab on {cfg.subnet} (state {cfg.path()})",
        telemetry=Telemetry(prometheus=cfg.prometheus_url),
        endpoints=Endpoints(
            consul=[cfg.url(h, p.consul_http) for h in CONSUL_HOSTS], nomad=[cfg.nomad_url], vault=[cfg.vault_url],
            dns=[cfg.dns_server], game=[f"http://{cfg.ip('edge')}:{p.edge_http}"],
            maintenance=[f"http://{cfg.maint_ip}:{p.edge_http}"],
            cache=[f"{cfg.ip(h)}:{p.redis}" for h in CACHE_HOSTS],
            # The lab's PostgreSQL serves no TLS, on the lab's private bridge on this machine: said so here, as
            # cache.warm checks a certificate (verify-full) wherever the inventory does not say otherwise.
            database=[f"postgresql://postgres@{cfg.ip(cfg.db_host)}:{p.postgres}/postgres?sslmode=disable"],
            extra={"node_agents": [f"http://{cfg.ip(h)}:{p.node_agent}" for h in CACHE_HOSTS]},
        ),
        hosts=hosts,
        ports={"consul": [p.consul_http], "nomad": [p.nomad_http], "vault": [p.vault_http]},
        secrets=secret_refs,
        vault=VaultLogin(address=cfg.vault_url, approle_role_id_file=str(sec.file("worker-role-id")),
                         approle_secret_id_file=str(sec.file("worker-secret-id"))),
        dns=DnsSteering(zone=STEER_ZONE, name=STEER_NAME, servers=[cfg.dns_server], game_ip=cfg.ip("edge"),
                        maint_ip=cfg.maint_ip, tsig_key_name="coldstart-steer.", tsig_secret=secret_refs["dns_tsig"]),
        consul=ConsulTarget(address=cfg.url(CONSUL_HOSTS[0], p.consul_http),
                            servers=[cfg.url(h, p.consul_http) for h in CONSUL_HOSTS], token=secret_refs["consul_token"]),
        nomad=NomadTarget(address=cfg.nomad_url, token=secret_refs["nomad_token"]),
        # Real agents: servers and clients, each restarted on its host. The stand-in: its client agents,
        # which apply their config directory on a reload (SIGHUP), as its servers have no agent config.
        consul_agents=[ConsulAgentHost(name=h, **hosts[h].executor.model_dump(exclude_unset=True),
                                       role="server" if h in CONSUL_HOSTS else "client",
                                       http=cfg.url(h, p.consul_http), config_dir=str(consul_agent_dir(cfg, h)),
                                       restart=consul_restart_argv(cfg, h))
                       for h in (*CONSUL_HOSTS, *CONSUL_CLIENT_HOSTS)] if found.consul is not None else [
            ConsulAgentHost(name=h, **hosts[h].executor.model_dump(exclude_unset=True), role="client",
                            http=cfg.url(h, p.consul_http), config_dir=str(consul_agent_dir(cfg, h)),
                            restart=standin_reload_argv(cfg, sec)) for h in CONSUL_CLIENT_HOSTS],
        groups={"consul_servers": [HostTarget(name=h, **hosts[h].executor.model_dump(exclude_unset=True))
                                   for h in CONSUL_HOSTS],
                "container_hosts": [HostTarget(name=h, **hosts[h].executor.model_dump(exclude_unset=True))
                                    for h in CACHE_HOSTS]},
        facts={"state_dir": str(cfg.path()), "controller_address": str(spec.gateway), "subnet": str(cfg.subnet),
               "snapshot_store": str(cfg.path("snapshots")),
               # What the cold-start runbook's destructive steps act on: facts of the target, not parameters.
               **COLD_START_FACTS, "forensics_dir": str(cfg.path("forensics")),
               # The backup job's objective: readiness says not ready when the newest snapshot is older.
               "rpo": "24h",
               "identity": identity_facts(cfg, sec),
               # Sources a Consul block keeps open (the controller and out-of-band telemetry), and the
               # client tiers let back in one at a time after a restore.
               "consul_block_allow": [{"name": "controller", "cidrs": [f"{spec.gateway}/32"]},
                                      {"name": "telemetry", "cidrs": [f"{cfg.ip('prom')}/32"]}],
               "consul_client_tiers": [{"name": "game-edge", "cidrs": [f"{cfg.ip('edge')}/32"]},
                                       {"name": "internal-services", "cidrs": [f"{cfg.ip('internal')}/32"]}],
               "nomad_job": "cache", "backends": found.describe(),
               # The session platform: containers in child cgroups of cgroup_parent, one store entry per repl.
               "sessions": {"store_prefix": cfg.session_store_prefix, "cgroup_parent": sessions_cgroup(cfg.prefix),
                            "container_host": cfg.container_host,
                            # What each host's provider metadata service is, as the host reaches it.
                            "metadata": {h: f"http://{cfg.ip(h)}:{p.node_agent}/latest/meta-data/spot/instance-action"
                                         for h in CACHE_HOSTS},
                            "router": f"http://{cfg.ip('edge')}:{p.session_router}",
                            "trigger": f"http://{spec.gateway}:{p.trigger}/alerts"}},
        services=user_services(cfg),
    )


# ---- down / status -------------------------------------------------------------------------------
def _signal_daemons(cfg: LabConfig) -> None:
    """Ask every recorded daemon to stop at once (postgres: fast shutdown) and wait a little;
    destroy() then SIGKILLs whatever is left, so `down` stays quick even with a stuck daemon."""
    state = load_state(cfg.state_dir)
    live = [(r.pid, r.starttime) for r in state.daemons.values() if pid_alive(r.pid, r.starttime)]
    for r in state.daemons.values():
        if pid_alive(r.pid, r.starttime):
            try:
                os.kill(r.pid, signal.SIGINT if r.name == "postgres" else signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and any(pid_alive(p, s) for p, s in live):
        time.sleep(0.05)


def down(cfg: LabConfig) -> list[str]:
    """Remove processes, namespaces, rules and files of the lab; works after a crash.

    Another lab still running on the same prefix (from another state dir) is left alone: only this lab's own
    files go, since its `up` was refused before it made anything there."""
    removed: list[str] = []
    other = occupant(cfg.spec)
    if other is not None and not other.abandoned:
        return _forget_files(cfg) + [f"kept namespaces of prefix {cfg.prefix}: {other.describe()}"]
    manifest: dict[str, Any] = {}
    try:
        manifest = json.loads(cfg.path(MANIFEST).read_text())
    except (OSError, ValueError):
        pass
    from lab import cgroups

    for group in cgroups.groups(f"coldstart-{cfg.prefix}-"):  # a throttled leader's cgroup (slow-leader)
        cgroups.release(group)
        removed.append(f"cgroup {group}")
    _signal_daemons(cfg)
    # Containers outlive a killed node agent (their own process trees): their cgroups say what is left.
    removed += [f"container {name}" for name in remove_sessions_cgroup(cfg.prefix)]
    removed += destroy(cfg.spec)
    return removed + _forget_files(cfg, manifest)


def _forget_files(cfg: LabConfig, manifest: dict[str, Any] | None = None) -> list[str]:
    """The lab's files in its state dir (logs stay), and its inventory if it wrote it."""
    removed: list[str] = []
    if manifest is None:
        try:
            manifest = json.loads(cfg.path(MANIFEST).read_text())
        except (OSError, ValueError):
            manifest = {}
    for sub in manifest.get("subdirs", STATE_SUBDIRS):
        path = cfg.path(sub)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"dir {path}")
    inv = Path(manifest.get("inventory") or cfg.inventory_path)
    if inv.exists() and _is_our_inventory(inv, cfg):
        inv.unlink()
        removed.append(f"file {inv}")
    for name in (MANIFEST, CONFIG, "faults.json", OWNER_FILE):
        cfg.path(name).unlink(missing_ok=True)
    return removed


def saved_config(state_dir: Path) -> LabConfig | None:
    """The config the running lab was built with, if any."""
    try:
        return LabConfig.model_validate_json((Path(state_dir) / CONFIG).read_text())
    except (OSError, ValueError):
        return None


def _is_our_inventory(path: Path, cfg: LabConfig) -> bool:
    # Never delete a hand-written or production inventory that happens to share the path.
    try:
        data = load_file(path) or {}
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("drill") is True and (data.get("facts") or {}).get("state_dir") == str(cfg.path())


def status(cfg: LabConfig) -> dict[str, Any]:
    state = load_state(cfg.state_dir)
    daemons = {k: {"pid": r.pid, "alive": pid_alive(r.pid, r.starttime), "log": r.log} for k, r in state.daemons.items()}
    return {
        "state_dir": str(cfg.path()),
        "inventory": str(Path(cfg.inventory_path).resolve()) if Path(cfg.inventory_path).exists() else None,
        "daemons": daemons,
        "netns": state.netns,
        "leftovers": leftovers(cfg.spec),
        "prometheus": cfg.prometheus_url,
        "backends": recorded_backends(cfg),
    }


def recorded_backends(cfg: LabConfig) -> dict[str, str] | None:
    """What the running lab was built on (its inventory's facts), not what PATH holds now."""
    try:
        return read_inventory(cfg.inventory_path).facts.get("backends")
    except (OSError, ValueError):
        return None

