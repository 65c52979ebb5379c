"""The lab network's shape: prefix, bridge, subnet and host name -> address offset."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

__all__ = ["DEFAULT_HOSTS", "DEFAULT_SSH_HOSTS", "LabSpec"]

DEFAULT_HOSTS: dict[str, int] = {
    "consul1": 11,
    "consul2": 12,
    "consul3": 13,
    "nomad": 20,
    "vault": 30,
    "dns": 40,
    "prom": 50,
    "cache1": 61,
    "cache2": 62,
    "cache3": 63,
    "edge": 70,
    "internal": 80,
    "players": 90,
}
DEFAULT_SSH_HOSTS = ["consul1", "consul2", "consul3"]

# Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
_IFNAME_MAX = 15
# No dashes in host names, so "<prefix>-<host>" parses back unambiguously during a prefix sweep
# (a "cs-test" lab's namespaces are never mistaken for the "cs" lab's).
_HOST_RE = re.compile(r"^[a-z][a-z0-9]{0,30}$")


class LabSpec(BaseModel):
    """One lab network; two specs with distinct prefix/bridge/veth_prefix/subnet can coexist."""

    prefix: str = Field(default="cs", pattern=r"^[a-z][a-z0-9-]{0,20}$")
    bridge: str = "csbr0"
    veth_prefix: str = Field(default="csv", pattern=r"^[a-z][a-z0-9]{0,9}$")
    subnet: ipaddress.IPv4Network = ipaddress.IPv4Network("10.213.0.0/24")
    gateway_offset: int = 1
    hosts: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_HOSTS))
    ssh_hosts: list[str] = Field(default_factory=lambda: list(DEFAULT_SSH_HOSTS))
    state_dir: Path = Path(".state/lab")

    @field_validator("bridge")
    @classmethod
    def _bridge_name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9]*", value) or len(value) > _IFNAME_MAX:
            raise ValueError(f"bridge name {value!r} must be [a-z0-9], at most {_IFNAME_MAX} chars")
        return value

    @field_validator("subnet")
    @classmethod
    def _private(cls, value: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        # The lab must never claim routable space: traffic is only allowed to stay local.
        if not value.is_private or value.is_loopback or value.prefixlen > 29:
            raise ValueError(f"subnet {value} must be a private IPv4 range of /29 or larger")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LabSpec:
        size = self.subnet.num_addresses
        offsets = {self.gateway_offset: "gateway"}
        for name, offset in self.hosts.items():
            if not _HOST_RE.match(name):
                raise ValueError(f"host name {name!r} must match {_HOST_RE.pattern}")
            if not 0 < offset < size - 1:
                raise ValueError(f"host {name}: offset {offset} outside {self.subnet}")
            if offset in offsets:
                raise ValueError(f"host {name}: offset {offset} already used by {offsets[offset]}")
            offsets[offset] = name
            if len(self.veth_name(name)) > _IFNAME_MAX:
                raise ValueError(f"veth name {self.veth_name(name)!r} too long")
        unknown = set(self.ssh_hosts) - set(self.hosts)
        if unknown:
            raise ValueError(f"ssh_hosts not in hosts: {sorted(unknown)}")
        if self.veth_prefix == self.bridge:
            raise ValueError("veth_prefix must differ from the bridge name")
        return self

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The controller/operator address, on the bridge in the root namespace."""
        return self.subnet.network_address + self.gateway_offset

    def address(self, host: str) -> ipaddress.IPv4Address:
        return self.subnet.network_address + self.hosts[host]

    def cidr(self, host: str) -> str:
        return f"{self.address(host)}/{self.subnet.prefixlen}"

    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def veth_name(self, host: str) -> str:
        # Named by offset, not host name, so it always fits in 15 bytes.
        return f"{self.veth_prefix}{self.hosts[host]}"

    @property
    def forward_chain(self) -> str:
        """Root-namespace filter chain keeping lab traffic inside the bridge."""
        return f"CSLAB-{self.bridge}"

    def owns_netns(self, name: str) -> bool:
        """True when `name` looks like one of this lab's namespaces (prefix sweep after a crash)."""
        head = f"{self.prefix}-"
        return name.startswith(head) and bool(_HOST_RE.match(name[len(head):]))

    def owns_veth(self, name: str) -> bool:
        return bool(re.fullmatch(re.escape(self.veth_prefix) + r"\d+", name))
