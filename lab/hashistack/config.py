"""Agent configurations for real Consul, Nomad and Vault/OpenBao, rendered as files their `-config` flag reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ConsulAgent", "NomadAgent", "VaultServer"]


def _hcl(value: Any) -> str:
    # HCL's string, number, bool and list literals are JSON's.
    return json.dumps(value)


@dataclass
class ConsulAgent:
    """One Consul agent (server or client) with ACLs on, default deny, and Prometheus telemetry."""

    node_name: str
    data_dir: Path
    bind: str
    management_token: str
    http_port: int = 8500
    serf_lan_port: int = 8301
    server_port: int = 8300
    server: bool = True
    bootstrap_expect: int = 1
    retry_join: list[str] = field(default_factory=list)
    datacenter: str = "dc1"
    client_addr: str | None = None
    # Clients' reads go through the streaming backend, as in the outage (agent config, not KV).
    use_streaming_backend: bool = True
    raft_multiplier: int = 1
    # Read after the main file (-config-dir): where an operator's drop-ins go (coldstart-streaming.json).
    config_dir: Path | None = None

    def render(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "datacenter": self.datacenter, "node_name": self.node_name, "data_dir": str(self.data_dir),
            "server": self.server, "bind_addr": self.bind, "advertise_addr": self.bind,
            "client_addr": self.client_addr or self.bind,
            "ports": {"http": self.http_port, "serf_lan": self.serf_lan_port, "server": self.server_port,
                      "serf_wan": -1, "dns": -1, "grpc": -1, "grpc_tls": -1},
            "retry_join": self.retry_join, "retry_interval": "1s",
            "acl": {"enabled": True, "default_policy": "deny", "down_policy": "extend-cache",
                    "enable_token_persistence": True,
                    "tokens": {"agent": self.management_token,
                               **({"initial_management": self.management_token} if self.server else {})}},
            "telemetry": {"prometheus_retention_time": "60s", "disable_hostname": True},
            "use_streaming_backend": self.use_streaming_backend,
            "log_level": "INFO", "enable_script_checks": False, "disable_update_check": True,
            "leave_on_terminate": False, "skip_leave_on_interrupt": True,
        }
        if self.server:
            cfg["bootstrap_expect"] = self.bootstrap_expect
            cfg["performance"] = {"raft_multiplier": self.raft_multiplier}
            # Snappy elections on a lab bridge (defaults are for WANs of real data centres).
            cfg["raft_snapshot_threshold"] = 8192
        return cfg

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.config_dir is not None:
            self.config_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.render(), indent=2))
        return path

    def argv(self, binary: Path, config: Path) -> list[str]:
        extra = [f"-config-dir={self.config_dir}"] if self.config_dir is not None else []
        return [str(binary), "agent", f"-config-file={config}", *extra]

    @property
    def url(self) -> str:
        return f"http://{self.client_addr or self.bind}:{self.http_port}"


@dataclass
class NomadAgent:
    """A Nomad agent: server, client (raw_exec on), or both; registers services in a local Consul agent."""

    name: str
    data_dir: Path
    bind: str
    http_port: int = 4646
    rpc_port: int = 4647
    serf_port: int = 4648
    server: bool = True
    client: bool = True
    servers: list[str] = field(default_factory=list)
    datacenter: str = "dc1"
    node_class: str = ""
    network_interface: str | None = None
    meta: dict[str, str] = field(default_factory=dict)
    consul_address: str | None = None
    consul_token: str | None = None

    def render(self) -> str:
        lines = [
            f"name = {_hcl(self.name)}", f"datacenter = {_hcl(self.datacenter)}",
            f"data_dir = {_hcl(str(self.data_dir))}", f"bind_addr = {_hcl(self.bind)}",
            'log_level = "INFO"', "disable_update_check = true", "leave_on_terminate = false",
            f"ports {{\n  http = {self.http_port}\n  rpc = {self.rpc_port}\n  serf = {self.serf_port}\n}}",
            f"advertise {{\n  http = {_hcl(self.bind)}\n  rpc = {_hcl(self.bind)}\n  serf = {_hcl(self.bind)}\n}}",
            f"server {{\n  enabled = {_hcl(self.server)}\n  bootstrap_expect = 1\n}}",
            ('telemetry {\n  prometheus_metrics = true\n  publish_allocation_metrics = true\n'
             '  publish_node_metrics = true\n  disable_hostname = true\n}'),
            'plugin "raw_exec" {\n  config {\n    enabled = true\n  }\n}',
        ]
        if self.client:
            # Only raw_exec: no probing for docker/java/qemu, which the lab never runs.
            client = [f"  enabled = {_hcl(True)}",
                      # ...and no cloud metadata probes: the lab is no cloud, and each probe costs seconds.
                      ('  options = {\n    "driver.allowlist" = "raw_exec"\n'
                       '    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"\n  }'),
                      f"  servers = {_hcl(self.servers or [f'{self.bind}:{self.rpc_port}'])}"]
            if self.node_class:
                client.append(f"  node_class = {_hcl(self.node_class)}")
            if self.network_interface:
                client.append(f"  network_interface = {_hcl(self.network_interface)}")
            if self.meta:
                client.append("  meta {\n" + "\n".join(f"    {_hcl(k)} = {_hcl(v)}" for k, v in self.meta.items())
                              + "\n  }")
            lines.append("client {\n" + "\n".join(client) + "\n}")
        if self.consul_address:
            consul = [f"  address = {_hcl(self.consul_address)}", "  auto_advertise = false",
                      "  server_auto_join = false", "  client_auto_join = false"]
            if self.consul_token:
                consul.append(f"  token = {_hcl(self.consul_token)}")
            lines.append("consul {\n" + "\n".join(consul) + "\n}")
        else:
            lines.append('consul {\n  address = "127.0.0.1:1"\n  auto_advertise = false\n'
                         '  server_auto_join = false\n  client_auto_join = false\n}')
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(self.render())
        return path

    def argv(self, binary: Path, config: Path) -> list[str]:
        # Nomad refuses to start with AWS_CA_BUNDLE set (its IMDS client cannot take the bundle).
        return ["/usr/bin/env", "-u", "AWS_CA_BUNDLE", str(binary), "agent", f"-config={config}"]

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.http_port}"


@dataclass
class VaultServer:
    """Vault or OpenBao in dev mode (in-memory, unsealed, KV v2 at secret/) with Prometheus telemetry."""

    address: str
    port: int
    root_token: str
    config_dir: Path

    def write(self) -> Path:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        path = self.config_dir / "telemetry.hcl"
        path.write_text('telemetry {\n  prometheus_retention_time = "60s"\n  disable_hostname = true\n}\n')
        return path

    def argv(self, binary: Path, config: Path) -> list[str]:
        return [str(binary), "server", "-dev", f"-dev-root-token-id={self.root_token}",
                f"-dev-listen-address={self.address}:{self.port}", f"-config={config}"]

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"
