"""Argv and start helpers for every lab daemon (stand-ins, pdns, Prometheus, Postgres, edge, agents, load)."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from lab.hosts.processes import start_daemon, stop_daemon
from lab.settings import CACHE_HOSTS, CONSUL_CLIENT_HOSTS, CONSUL_HOSTS, LabConfig

__all__ = [
    "PY",
    "Secrets",
    "consul_argv",
    "edge_argv",
    "internal_argv",
    "node_agent_argv",
    "nomad_argv",
    "players_argv",
    "restart_load",
    "session_router_argv",
]

PY = sys.executable
STEER_ZONE = "play.coldstart.lab."
STEER_NAME = "play"


class Secrets:
    """Lab credentials, generated once into <state>/secrets (0700/0600) so re-runs of `up` reuse them."""

    NAMES = ("vault-root-token", "consul-token", "nomad-token", "worker-role-id", "worker-secret-id", "trigger-token")

    def __init__(self, cfg: LabConfig) -> None:
        self.dir = cfg.path("secrets")

    def ensure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        for name in self.NAMES:
            path = self.file(name)
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(secrets.token_hex(16) + "\n")

    def file(self, name: str) -> Path:
        return self.dir / name

    def read(self, name: str) -> str:
        return self.file(name).read_text().strip()

    def write(self, name: str, value: str) -> None:
        """A secret the lab learns rather than makes (Vault's unseal key), 0600 like the rest."""
        fd = os.open(self.file(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")


def consul_argv(cfg: LabConfig, sec: Secrets) -> list[str]:
    argv = [PY, "-m", "lab.standins", "consul", "--acl-token-file", str(sec.file("consul-token")),
            "--state-dir", str(cfg.path("consul"))]
    for host in CONSUL_HOSTS:
        argv += ["--server", f"{host}={cfg.spec.netns(host)}:{cfg.ip(host)}:{cfg.ports.consul_http}"]
    for host, config_dir in consul_client_dirs(cfg).items():
        argv += ["--client", f"{host}={config_dir}@{cfg.spec.netns(host)}:{cfg.ip(host)}:{cfg.ports.consul_http}"]
    return argv


def consul_agent_dir(cfg: LabConfig, host: str) -> Path:
    """The agent's config directory (-config-dir), where drop-ins such as the streaming setting go."""
    return cfg.path("consul", host, "config.d")


def consul_client_dirs(cfg: LabConfig) -> dict[str, Path]:
    """Each client agent host's config directory (real agents; the stand-in reads them too)."""
    return {host: consul_agent_dir(cfg, host) for host in CONSUL_CLIENT_HOSTS}


def standin_reload_argv(cfg: LabConfig, sec: Secrets) -> list[str]:
    """How a stand-in client agent applies its config directory: SIGHUP to the one stand-in process (found by
    its token file, which only this lab's stand-in is given), like `consul reload`."""
    return ["pkill", "-HUP", "-f", f"lab.standins consul --acl-token-file {sec.file('consul-token')} "]


def nomad_argv(cfg: LabConfig) -> list[str]:
    argv = [PY, "-m", "lab.standins", "nomad", "--state-dir", str(cfg.path("nomad")),
            "--listen", f"{cfg.spec.netns('nomad')}:{cfg.ip('nomad')}:{cfg.ports.nomad_http}"]
    for host in CACHE_HOSTS:
        # netns in Meta is how the stand-in's raw_exec driver places a task in the node's namespace.
        argv += ["--node", f"{host}:netns={cfg.spec.netns(host)},class=cache,address={cfg.ip(host)}"]
    # The internal services' jobs run here, in a datacenter of their own (lab/users.py).
    argv += ["--node", (f"internal:netns={cfg.spec.netns('internal')},class=services,dc=services,"
                        f"address={cfg.ip('internal')}")]
    return argv


def redis_args(cfg: LabConfig) -> list[str]:
    # No persistence: a restarted cache node starts cold, as in the drill's cold-cache phase.
    return ["--bind", "0.0.0.0", "--port", str(cfg.ports.redis), "--protected-mode", "no",
            "--save", "", "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]


def edge_argv(cfg: LabConfig, sec: Secrets) -> list[str]:
    argv = [PY, "-m", "lab.edge", "--game", f"{cfg.ip('edge')}:{cfg.ports.edge_http}",
            "--maintenance", f"{cfg.maint_ip}:{cfg.ports.edge_http}",
            "--dsn", f"postgresql://postgres@{cfg.ip(cfg.db_host)}:{cfg.ports.postgres}/postgres",
            "--consul", cfg.consul_url, "--consul-token-file", str(sec.file("consul-token"))]
    for host in CACHE_HOSTS:
        argv += ["--redis", f"{cfg.ip(host)}:{cfg.ports.redis}"]
    return argv


def node_agent_argv(cfg: LabConfig, host: str) -> list[str]:
    containers = cfg.containers if host == cfg.container_host else 0
    return [PY, "-m", "lab.node_agent", "--node", host, "--listen", f"{cfg.ip(host)}:{cfg.ports.node_agent}",
            "--redis-port", str(cfg.ports.redis), "--containers", str(containers),
            "--notice-s", str(cfg.preempt_notice_s), "--prefix", cfg.prefix, "--state-dir", str(cfg.path()),
            "--consul", cfg.consul_url, "--token-file", str(Secrets(cfg).file("consul-token")),
            "--store-prefix", cfg.session_store_prefix, "--drain-s", str(cfg.container_drain_s)]


def session_router_argv(cfg: LabConfig) -> list[str]:
    return [PY, "-m", "lab.session_router", "--listen", f"{cfg.ip('edge')}:{cfg.ports.session_router}",
            "--consul", cfg.consul_url, "--token-file", str(Secrets(cfg).file("consul-token")),
            "--store-prefix", cfg.session_store_prefix]


def players_argv(cfg: LabConfig, rps: float, duration: float, clients: int) -> list[str]:
    return [PY, "-m", "lab.players", "--dns", cfg.dns_server, "--zone", STEER_ZONE,
            "--name", f"{STEER_NAME}.{STEER_ZONE}", "--game-ip", cfg.ip("edge"), "--maint-ip", cfg.maint_ip,
            "--port", str(cfg.ports.edge_http), "--metrics", f"{cfg.ip('players')}:{cfg.ports.players_metrics}",
            "--clients", str(clients), "--rps", str(rps), "--duration", str(duration),
            "--players", str(cfg.seed_players)]


def internal_argv(cfg: LabConfig, sec: Secrets, rps: float, duration: float, watchers: int = 0) -> list[str]:
    argv = [PY, "-m", "lab.internal_load", "--token-file", str(sec.file("consul-token")),
            "--metrics", f"{cfg.ip('internal')}:{cfg.ports.internal_metrics}", "--watchers", str(watchers),
            "--rps", str(rps), "--duration", str(duration), "--nomad", cfg.nomad_url,
            "--users-file", str(cfg.path("users", "internal-users.json"))]
    for host in CONSUL_HOSTS:
        argv += ["--consul", cfg.url(host, cfg.ports.consul_http)]
    return argv


def restart_load(cfg: LabConfig, *, players_rps: float, internal_rps: float, duration: float,
                 clients: int, watchers: int = 0) -> dict[str, int]:
    """(Re)start both generators with new bounds; they die with the lab (PIDs are in its state)."""
    sec = Secrets(cfg)
    spec = cfg.spec
    stop_daemon(spec, "players", "players")
    stop_daemon(spec, "internal", "internal-load")
    p = start_daemon(spec, "players", "players", players_argv(cfg, players_rps, duration, clients))
    i = start_daemon(spec, "internal", "internal-load", internal_argv(cfg, sec, internal_rps, duration, watchers))
    return {"players": p.pid, "internal-load": i.pid}
