"""Contracts of the Vault actions: health, a secret's reference (never its value), the OIDC keys that verify approvers."""

from __future__ import annotations

from pydantic import Field, field_validator

from activities.contracts.model import ContractModel
from activities.contracts.targets import VaultSecretRef
from activities.oidc import IDENTITY_KEYS_ACTION, IdentityKeys
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "HEALTH",
    "IDENTITY_KEYS",
    "READ",
    "HealthInput",
    "HealthOutput",
    "IdentityKeysInput",
    "ReadInput",
    "ReadOutput",
]


class HealthInput(ContractModel):
    address: str = Field(pattern=r"^https?://", description="Vault URL, e.g. http://10.0.0.5:8200")
    ca_cert: str | None = None
    standby_ok: bool = Field(default=True, description="a standby (not the active node) still counts as healthy")
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)


class HealthOutput(ContractModel):
    initialized: bool
    sealed: bool
    standby: bool
    version: str | None
    cluster_name: str | None


class ReadInput(ContractModel):
    address: str = Field(pattern=r"^https?://")
    mount: str = "secret"
    path: str
    version: int | None = Field(default=None, ge=1, description="default: the current version")
    require_keys: list[str] = Field(default_factory=list, description="fail unless the secret has these keys")
    token_env: str = "VAULT_TOKEN"
    token_file: str | None = None
    ca_cert: str | None = None

    @field_validator("path", "mount")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip("/"):
            raise ValueError("must be non-empty")
        return value.strip("/")


class ReadOutput(ContractModel):
    """Where the secret is and what it holds (key names), to hand to other steps as a reference."""

    address: str
    mount: str
    path: str
    version: int
    keys: list[str]
    created_time: str | None
    refs: dict[str, VaultSecretRef] = Field(description="one VaultSecretRef per key, for steps that take one")


class IdentityKeysInput(ContractModel):
    address: str = Field(pattern=r"^https?://", description="Vault URL, e.g. https://10.0.0.5:8200")
    provider: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="the OIDC provider whose tokens carry a decision's nonce; omitted: identity/oidc's own keys")
    ca_cert: str | None = None
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)


HEALTH = declare(
    "vault.health", HealthInput, HealthOutput, timeout=60, retry=Retry(max_attempts=3),
    doc="""Read sys/health; sealed or uninitialized (or standby when standby_ok is false) is an error.""",
)


READ = declare(
    "vault.read", ReadInput, ReadOutput, timeout=60, retry=Retry(max_attempts=3),
    doc="""Check a KV v2 secret exists and return a reference to it (mount, path, version, key names), not its value.""",
)


IDENTITY_KEYS = declare(
    IDENTITY_KEYS_ACTION, IdentityKeysInput, IdentityKeys, timeout=60, retry=Retry(max_attempts=5),
    doc="""Capture Vault's OIDC issuer and public keys (public endpoints, no token) to verify approvers' identity tokens.""",
)
