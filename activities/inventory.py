"""The target inventory (targets/NAME.yaml): what an operator writes once and the actions read, built from their models."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from activities._fields import unique_names
from activities.consul.agent_hosts import ConsulAgentHost
from activities.consul.services import UserService
from activities.contracts.targets import ConsulTarget, HostTarget, NomadTarget, ShellAccess, VaultSecretRef
from activities.policy import TargetPolicy
from activities.strict import StrictModel

__all__ = ["DnsSteering", "Endpoints", "Host", "Inventory", "Telemetry", "VaultLogin"]

# The parts an action takes as they are (a cluster, a secret, a host, a service) are the actions'
# own models, so an entry that validates here is a valid action argument. The rest only says where
# things are, for runbooks to reference (`${{ target.dns.zone }}`).


class Host(StrictModel):
    """One machine: its address, what runs there, and how to reach a shell on it."""

    address: str
    roles: list[str] = Field(default_factory=list)
    executor: ShellAccess | None = None


class VaultLogin(StrictModel):
    """Where the worker finds its AppRole credentials (files, so they stay out of workflow history)."""

    address: str
    approle_role_id_file: str
    approle_secret_id_file: str


class Endpoints(StrictModel):
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


class DnsSteering(StrictModel):
    """The steered name and what dns.steer.* needs, the TSIG secret as a Vault reference."""

    zone: str
    name: str
    servers: list[str] = Field(min_length=1)
    game_ip: str
    maint_ip: str
    tsig_key_name: str
    tsig_secret: VaultSecretRef


class Telemetry(StrictModel):
    prometheus: str
    metrics: dict[str, list[str]] = Field(default_factory=dict)


class Inventory(StrictModel):
    """A target: `drill: true` marks a lab (drills are refused on anything else); `development: true` lets
    a run bring a runbook the controller's catalog does not hold (never mark a production target so)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    drill: bool = False
    development: bool = False
    description: str = ""
    telemetry: Telemetry
    endpoints: Endpoints = Field(default_factory=Endpoints)
    hosts: dict[str, Host] = Field(default_factory=dict)
    # Ports a "block clients" step closes (Consul HTTP/DNS/RPC ...), per service.
    ports: dict[str, list[int]] = Field(default_factory=dict)
    secrets: dict[str, VaultSecretRef] = Field(default_factory=dict)
    vault: VaultLogin | None = None
    dns: DnsSteering | None = None
    consul: ConsulTarget | None = None
    # Every Consul agent whose own configuration an action changes (consul.agents.streaming): its host's
    # shell, its API, its config directory and how it restarts.
    consul_agents: Annotated[list[ConsulAgentHost], unique_names("consul agent")] = Field(default_factory=list)
    nomad: NomadTarget | None = None
    # Named lists of hosts, ready to pass to host actions (e.g. groups.consul_servers to firewall.block).
    groups: dict[str, list[HostTarget]] = Field(default_factory=dict)
    # Services that use Consul, in tiers: the non-essential ones are disabled during a cold start.
    services: list[UserService] = Field(default_factory=list)
    # Who may start, approve and steer runs here; a runbook may narrow it, never widen it.
    policy: TargetPolicy | None = None
    # Free-form facts for humans and runbook params (state dir, controller address, ...).
    facts: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _agents_on_known_hosts(self) -> Inventory:
        # An agent's shell must be the one its host entry gives, or a change would land on another machine.
        for agent in self.consul_agents:
            host = self.hosts.get(agent.name)
            if host is not None and host.executor is not None:
                given = ShellAccess.model_validate(agent.model_dump(include=set(ShellAccess.model_fields)))
                if given != host.executor:
                    raise ValueError(f"consul_agents {agent.name}: its shell access differs from hosts.{agent.name}.executor")
        return self

    def hosts_with_role(self, role: str) -> dict[str, Host]:
        return {name: h for name, h in self.hosts.items() if role in h.roles}

    def as_target(self) -> dict[str, Any]:
        """What runbooks see as `target`: the fields the file gave, as JSON."""
        return self.model_dump(mode="json", exclude_unset=True)
