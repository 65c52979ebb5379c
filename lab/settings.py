"""The whole lab's knobs (state dir, address range, ports, load bounds) and the derived host spec."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from lab.hosts.spec import DEFAULT_HOSTS, DEFAULT_SSH_HOSTS, LabSpec

__all__ = ["CACHE_HOSTS", "CONSUL_HOSTS", "LabConfig", "LabPorts"]

CONSUL_CLIENT_HOSTS = ("internal", "edge")  # hosts with a Consul client agent
CONSUL_HOSTS = ("consul1", "consul2", "consul3")
CACHE_HOSTS = ("cache1", "cache2", "cache3")
# PostgreSQL gets a host of its own so a fault on a cache node never takes the database along.
DB_HOST, DB_OFFSET = "db", 65


class LabPorts(BaseModel):
    """Listening ports inside the host namespaces (each host has its own address, so no clashes)."""

    consul_http: int = 8500
    nomad_http: int = 4646
    vault_http: int = 8200
    dns: int = 53
    pdns_web: int = 8081
    prometheus: int = 9090
    edge_http: int = 8080  # game on the edge address, maintenance page on the maintenance address
    players_metrics: int = 9101
    internal_metrics: int = 9102
    node_agent: int = 9103
    cgroup_exporter: int = 9104
    session_router: int = 9105
    alertmanager: int = 9093
    # coldstart's alert trigger (`coldstart triggers serve`) on the controller, where Alertmanager sends.
    trigger: int = 9095
    redis: int = 6379
    postgres: int = 5432


class LabConfig(BaseModel):
    """Everything `lab up` needs; the CLI fills it from options, tests from tmp dirs."""

    state_dir: Path = Path(".state/lab")
    subnet: ipaddress.IPv4Network = ipaddress.IPv4Network("10.213.0.0/24")
    prefix: str = "cs"
    bridge: str = "csbr0"
    veth_prefix: str = "csv"
    ports: LabPorts = Field(default_factory=LabPorts)
    inventory_path: Path = Path("targets/lab.yaml")
    # Address of the offset of the maintenance IP (second address on the edge host).
    maint_offset: int = 71
    # host:port where the coldstart worker serves metrics (scraped if given).
    worker_metrics: str | None = None
    scrape_interval: str = "2s"
    # When set, the preempted host's signals (its notice and containers from the node agents, the sessions
    # from the router) are scraped, and the host alerts evaluated, this often: what a drain inside a 30 s
    # notice waits for twice, the alert and its gates' fresh samples (the drain lab: 250ms).
    drain_signals_interval: str | None = None
    # Load generators are bounded: rates and total run time; `lab load` changes them.
    players_rps: float = 50.0
    players_clients: int = 2000
    internal_rps: float = 20.0
    load_duration_s: float = 3600.0
    # The preempted-host scenario: containers on this host, and the notice they get.
    container_host: str = "cache3"
    containers: int = 4
    preempt_notice_s: float = 30.0
    # What a container's graceful stop (SIGTERM) takes before it exits; the session store's key prefix.
    container_drain_s: float = 0.5
    session_store_prefix: str = "sessions/"
    seed_players: int = 2000

    @model_validator(mode="after")
    def _check(self) -> LabConfig:
        _ = self.spec  # validates the network shape early
        if self.maint_offset in self.spec.hosts.values() or not 0 < self.maint_offset < self.subnet.num_addresses - 1:
            raise ValueError(f"maint_offset {self.maint_offset} collides with a host or lies outside {self.subnet}")
        if self.container_host not in CACHE_HOSTS:
            raise ValueError(f"container_host must be one of {CACHE_HOSTS} (hosts running the node agent)")
        return self

    @property
    def spec(self) -> LabSpec:
        return LabSpec(
            prefix=self.prefix, bridge=self.bridge, veth_prefix=self.veth_prefix, subnet=self.subnet,
            hosts={**DEFAULT_HOSTS, DB_HOST: DB_OFFSET}, ssh_hosts=list(DEFAULT_SSH_HOSTS),
            state_dir=self.state_dir,
        )

    def ip(self, host: str) -> str:
        return str(self.spec.address(host))

    @property
    def maint_ip(self) -> str:
        return str(self.subnet.network_address + self.maint_offset)

    @property
    def db_host(self) -> str:
        return DB_HOST

    def url(self, host: str, port: int) -> str:
        return f"http://{self.ip(host)}:{port}"

    @property
    def consul_url(self) -> str:
        return self.url("consul1", self.ports.consul_http)

    @property
    def nomad_url(self) -> str:
        return self.url("nomad", self.ports.nomad_http)

    @property
    def vault_url(self) -> str:
        return self.url("vault", self.ports.vault_http)

    @property
    def prometheus_url(self) -> str:
        return self.url("prom", self.ports.prometheus)

    @property
    def dns_server(self) -> str:
        return f"{self.ip('dns')}:{self.ports.dns}"

    def path(self, *parts: str) -> Path:
        return Path(self.state_dir).resolve().joinpath(*parts)
