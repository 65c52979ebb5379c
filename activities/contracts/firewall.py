"""Contracts of the firewall actions: block service ports with iptables, then let clients back in tier by tier."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from activities._fields import unique_names
from activities.contracts.model import ContractModel
from activities.contracts.targets import HostTarget
from activities.firewall.rules import AllowTier
from activities.registry import declare

__all__ = [
    "ALLOW",
    "BLOCK",
    "DEFAULT_CHAIN",
    "MAX_PORTS",
    "REVOKE",
    "STATUS",
    "UNBLOCK",
    "AllowInput",
    "AllowOutput",
    "BlockInput",
    "BlockOutput",
    "HostChange",
    "HostStatus",
    "RevokeInput",
    "RevokeOutput",
    "StatusInput",
    "StatusOutput",
    "Targeted",
    "UnblockInput",
    "UnblockOutput",
]

DEFAULT_CHAIN = "COLDSTART-BLOCK"


# iptables' multiport match takes at most 15 ports; one jump rule keeps the check atomic.
MAX_PORTS = 15


class Targeted(ContractModel):
    hosts: Annotated[list[HostTarget], unique_names("host")] = Field(min_length=1)
    chain: str = Field(default=DEFAULT_CHAIN, pattern=r"^[A-Z][A-Z0-9_-]{0,27}$")
    max_parallel: int = Field(default=8, ge=1, le=64)

    @field_validator("chain")
    @classmethod
    def _not_builtin(cls, chain: str) -> str:
        if chain in {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}:
            raise ValueError(f"chain {chain!r} is built in; the block needs its own chain")
        return chain


def _tiers(values: Any) -> Any:
    # Runbooks may write `allow: [10.0.0.1/32, ...]`; bare CIDRs form one tier named "allow".
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return [{"name": "allow", "cidrs": values}]
    return values


class BlockInput(Targeted):
    """Which hosts, which TCP ports, and who may still connect (in priority order)."""

    ports: list[int] = Field(min_length=1, max_length=MAX_PORTS)
    allow: list[AllowTier] = Field(min_length=1)

    @field_validator("allow", mode="before")
    @classmethod
    def _allow_bare(cls, values: Any) -> Any:
        return _tiers(values)

    @field_validator("ports")
    @classmethod
    def _ports(cls, ports: list[int]) -> list[int]:
        bad = [p for p in ports if not 1 <= p <= 65535]
        if bad:
            raise ValueError(f"ports out of range: {bad}")
        return sorted(set(ports))

    @model_validator(mode="after")
    def _keeps_access(self) -> BlockInput:
        # Blocking the port the controller reaches a host by would lock the recovery out of it.
        for host in self.hosts:
            if host.kind == "ssh" and host.port in self.ports:
                raise ValueError(f"host {host.name}: ports include its ssh port {host.port}")
        names = [t.name for t in self.allow]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tier names: {names}")
        return self


class UnblockInput(Targeted):
    """Remove the block chain and its INPUT jump."""


class AllowInput(Targeted):
    """Add one tier's sources to an existing block (staged unblocking)."""

    tier: AllowTier


class RevokeInput(Targeted):
    """Remove one tier's sources from an existing block (take a tier back out)."""

    tier: AllowTier


class StatusInput(Targeted):
    """Read the block on each host."""


class HostChange(ContractModel):
    """What one call did on one host; `rules` is the chain afterwards as iptables-save lists it."""

    host: str
    changed: bool
    actions: list[str] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)


class BlockOutput(ContractModel):
    hosts: list[HostChange]
    changed_hosts: list[str]
    undo: UnblockInput


class UnblockOutput(ContractModel):
    hosts: list[HostChange]
    changed_hosts: list[str]


class AllowOutput(ContractModel):
    hosts: list[HostChange]
    changed_hosts: list[str]
    undo: RevokeInput


class RevokeOutput(ContractModel):
    hosts: list[HostChange]
    changed_hosts: list[str]
    undo: AllowInput


class HostStatus(ContractModel):
    host: str
    blocked: bool = False
    ports: list[int] = Field(default_factory=list)
    tiers: dict[str, list[str]] = Field(default_factory=dict)
    loopback: bool = False
    rejects: bool = False
    jump_first: bool = False
    problems: list[str] = Field(default_factory=list)
    error: str | None = None


class StatusOutput(ContractModel):
    hosts: list[HostStatus]


BLOCK = declare(
    "firewall.block", BlockInput, BlockOutput, mutating=True, undo="firewall.unblock", undo_from_output="undo", timeout=120,
    doc="""Reject TCP to the given ports on each host except from the allow-list (loopback always allowed).

    Declarative: the chain ends up holding exactly `allow`, so re-running it after
    firewall.allow calls takes those tiers back out (each removal is reported).
    """,
)


UNBLOCK = declare(
    "firewall.unblock", UnblockInput, UnblockOutput, mutating=True, timeout=120,
    doc="""Remove the block chain and its INPUT jump from each host; a no-op where there is none.""",
)


ALLOW = declare(
    "firewall.allow", AllowInput, AllowOutput, mutating=True, undo="firewall.revoke", undo_from_output="undo", timeout=120,
    doc="""Let one tier of sources through an existing block (added before the final reject).""",
)


REVOKE = declare(
    "firewall.revoke", RevokeInput, RevokeOutput, mutating=True, undo="firewall.allow", undo_from_output="undo", timeout=120,
    doc="""Take one tier's sources back out of an existing block (only rules tagged with that tier).""",
)


STATUS = declare(
    "firewall.status", StatusInput, StatusOutput, timeout=60,
    doc="""Report the block on each host: ports, allowed tiers, and anything that looks wrong.""",
)
