"""What actions act on, as plain data that travels in inputs: a secret in Vault, a Consul or Nomad cluster, a host's shell."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from activities._fields import BaseUrl
from activities.contracts.model import ContractModel

__all__ = ["NETNS_NAME", "ConsulTarget", "HostTarget", "NomadTarget", "ShellAccess", "VaultSecretRef"]


class VaultSecretRef(ContractModel):
    """Where a secret lives and how to log in; holds no secret itself, so it may sit in an input."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(description="Vault URL, e.g. http://10.0.0.5:8200")
    mount: str = Field(default="secret", description="KV v2 mount point")
    path: str = Field(description="secret path under the mount, e.g. coldstart/dns-tsig")
    field: str = Field(description="key inside the secret's data")
    token_env: str = Field(default="VAULT_TOKEN", description="env var holding the token")
    token_file: str | None = Field(default=None, description="file holding the token; wins over token_env")
    ca_cert: str | None = Field(default=None, description="CA bundle for https; default system trust")
    cache_seconds: float = Field(
        default=0, ge=0, le=300,
        description="how long one worker may reuse the value it read (0: read Vault on every use). For ACL tokens "
                    "a fan-out uses thousands of times; a secret whose absence must fail a step at once keeps 0")

    @model_validator(mode="after")
    def _shape(self) -> VaultSecretRef:
        if not self.address.startswith(("http://", "https://")):
            raise ValueError("address must be an http(s) URL")
        if not self.path.strip("/") or not self.field or not self.mount.strip("/"):
            raise ValueError("mount, path and field must be non-empty")
        return self


def _distinct(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


class ConsulTarget(ContractModel):
    """How to reach a Consul cluster; the ACL token is a Vault reference, read inside the activity."""

    model_config = ConfigDict(extra="forbid")

    address: BaseUrl = Field(description="an agent's HTTP API base URL, e.g. http://10.0.0.5:8500")
    servers: Annotated[list[BaseUrl], AfterValidator(_distinct)] = Field(
        default_factory=list,
        description="every server's HTTP API URL (health/leader actions read metrics from the leader's agent)",
    )
    token: VaultSecretRef | None = Field(default=None, description="where the Consul ACL token lives in Vault")
    datacenter: str | None = None
    ca_cert: str | None = Field(default=None, description="CA bundle for https; default system trust")
    timeout_seconds: float = Field(default=15.0, gt=0, le=600)


class NomadTarget(ContractModel):
    """How to reach a Nomad cluster; the ACL token is a Vault reference, read inside the activity."""

    model_config = ConfigDict(extra="forbid")

    address: BaseUrl = Field(description="Nomad HTTP API base URL, e.g. http://10.0.0.6:4646")
    token: VaultSecretRef | None = Field(default=None, description="where the Nomad ACL token lives in Vault")
    region: str | None = None
    ca_cert: str | None = None
    timeout_seconds: float = Field(default=15.0, gt=0, le=600)


NETNS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ShellAccess(ContractModel):
    """How to reach a shell on a host: ssh with its host key pinned, or a network namespace on this machine."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["ssh", "netns"] = "ssh"
    address: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    user: str = "root"
    key_path: str | None = None
    known_hosts: str | None = None
    host_key: str | None = None
    # A name under /run/netns, never a path: `ip netns exec` would follow one anywhere.
    netns: str | None = Field(default=None, max_length=64, pattern=NETNS_NAME.pattern)
    sudo: bool = False
    # As Ansible's interpreter setting: the scripts some actions run on the host start with it.
    python: str = Field(default="python3", max_length=256, pattern=r"^[A-Za-z0-9_./+-]+$",
                        description="the host's Python 3 (a name on its PATH or an absolute path)")

    def _who(self) -> str:
        return "executor"

    @model_validator(mode="after")
    def _complete(self) -> ShellAccess:
        if self.kind == "ssh":
            if not self.address:
                raise ValueError(f"{self._who()}: ssh target needs an address")
            if not self.key_path:
                raise ValueError(f"{self._who()}: ssh target needs key_path")
        elif not self.netns:
            raise ValueError(f"{self._who()}: netns target needs netns")
        return self


class HostTarget(ShellAccess):
    """How an activity reaches one named host; travels in workflow inputs, so plain data only."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

    def _who(self) -> str:
        return f"host {self.name}"
