"""Target inventory schema (targets/NAME.yaml) shared by drill lab and production; imports pydantic, yaml, yaml_safety."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflows.yaml_safety import load_file

__all__ = [
    "DnsSteering",
    "Endpoints",
    "Cluster",
    "Executor",
    "Host",
    "HostTarget",
    "Inventory",
    "SecretRef",
    "Telemetry",
    "UserService",
    "VaultLogin",
    "load_inventory_file",
    "write_inventory",
]

# No import from lab/ or activities/ on purpose: runbooks and activities validate production
# inventories with this module, and it is meant to move out of lab/ unchanged (with
# workflows.yaml_safety, the guarded YAML reader, which imports only yaml).


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Executor(_Strict):
    """How to run commands on a host; the same fields as activities.executors.HostTarget."""

    kind: Literal["ssh", "netns"] = "ssh"
    address: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    user: str = "root"
    key_path: str | None = None
    known_hosts: str | None = None
    netns: str | None = None
    sudo: bool = False

    @model_validator(mode="after")
    def _complete(self) -> "Executor":
        if self.kind == "ssh" and not (self.address and self.key_path and self.known_hosts):
            raise ValueError("an ssh executor needs address, key_path and known_hosts (host keys are pinned)")
        if self.kind == "netns" and not self.netns:
            raise ValueError("a netns executor needs netns")
        return self


class Host(_Strict):
    """One machine: its address, what runs there, and how to reach a shell on it."""

    address: str
    roles: list[str] = Field(default_factory=list)
    executor: Executor | None = None


class SecretRef(_Strict):
    """A Vault KV v2 location (never the secret): same fields as activities.secrets.VaultSecretRef."""

    address: str
    mount: str = "secret"
    path: str
    field: str


class VaultLogin(_Strict):
    """Where the worker finds its AppRole credentials (files, so they stay out of workflow history)."""

    address: str
    approle_role_id_file: str
    approle_secret_id_file: str


class Endpoints(_Strict):
    """Service APIs as URLs / ip:port; lists hold every member so runbooks can address each one."""

    consul: list[str] = Field(default_factory=list)
    nomad: list[str] = Field(default_factory=list)
    vault: list[str] = Field(default_factory=list)
    dns: list[str] = Field(default_factory=list)
    game: list[str] = Field(default_factory=list)
    maintenance: list[str] = Field(default_factory=list)
    cache: list[str] = Field(default_factory=list)
    database: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class DnsSteering(_Strict):
    """The steered name and everything dns.steer.* needs, with the TSIG secret as a Vault reference."""

    zone: str
    name: str
    servers: list[str] = Field(min_length=1)
    game_ip: str
    maint_ip: str
    tsig_key_name: str
    tsig_secret: SecretRef


class Cluster(_Strict):
    """How actions reach a cluster's API: the same fields as activities' ConsulTarget / NomadTarget."""

    address: str
    servers: list[str] = Field(default_factory=list)
    token: SecretRef | None = None


class HostTarget(_Strict):
    """One host in the shape firewall actions take (activities.executors.HostTarget), for host groups."""

    name: str
    kind: Literal["ssh", "netns"] = "ssh"
    address: str | None = None
    port: int = 22
    user: str = "root"
    key_path: str | None = None
    known_hosts: str | None = None
    netns: str | None = None


class UserService(_Strict):
    """A Consul user for the disable/enable steps: the same fields as activities.consul.UserService.

    check_owner says who defines the health check stretched while the service is disabled:
    nomad: the `service` block (provider consul) of nomad_job/nomad_group named check_service
    (default: name), check check_name (default: its only check); agent: registered on check_agent
    (default: the Consul address) as check_id, check_definition being its full registration body
    (the agent never reports the target, headers or method); absent: no check is changed.
    """

    name: str
    tier: str = ""
    essential: bool = False
    usage_flag_key: str | None = None
    nomad_job: str | None = None
    nomad_group: str | None = None
    nomad_namespace: str = "default"
    check_owner: Literal["nomad", "agent"] | None = None
    check_service: str | None = None
    check_name: str | None = None
    check_id: str | None = None
    check_agent: str | None = None
    check_definition: dict[str, Any] | None = None


class Telemetry(_Strict):
    prometheus: str
    metrics: dict[str, list[str]] = Field(default_factory=dict)


class Inventory(_Strict):
    """A target: `drill: true` marks a lab (drills are refused on anything else)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    drill: bool = False
    description: str = ""
    telemetry: Telemetry
    endpoints: Endpoints = Field(default_factory=Endpoints)
    hosts: dict[str, Host] = Field(default_factory=dict)
    # Ports a "block clients" step closes (Consul HTTP/DNS/RPC ...), per service.
    ports: dict[str, list[int]] = Field(default_factory=dict)
    secrets: dict[str, SecretRef] = Field(default_factory=dict)
    vault: VaultLogin | None = None
    dns: DnsSteering | None = None
    consul: Cluster | None = None
    nomad: Cluster | None = None
    # Named lists of hosts, ready to pass to host actions (e.g. groups.consul_servers to firewall.block).
    groups: dict[str, list[HostTarget]] = Field(default_factory=dict)
    # Services that use Consul, in tiers: the non-essential ones are disabled during a cold start.
    services: list[UserService] = Field(default_factory=list)
    # Free-form facts for humans and runbook params (state dir, controller address, ...).
    facts: dict[str, Any] = Field(default_factory=dict)

    def hosts_with_role(self, role: str) -> dict[str, Host]:
        return {name: h for name, h in self.hosts.items() if role in h.roles}


def write_inventory(inventory: Inventory, path: str | Path) -> Path:
    """Write atomically (a runbook never reads half a file); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    header = "# Written by `coldstart lab up`; removed by `coldstart lab down`. Schema: lab/inventory.py\n"
    tmp.write_text(header + yaml.safe_dump(inventory.model_dump(mode="json", exclude_none=True), sort_keys=False))
    os.replace(tmp, path)
    return path


def load_inventory_file(path: str | Path) -> Inventory:
    """Read and validate an inventory; a hostile or malformed file raises ValueError as `file:line:col: message`."""
    data = load_file(path) or {}
    return Inventory.model_validate(data)
