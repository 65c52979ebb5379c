"""Vault actions: health (a sealed Vault is an error) and a secret's reference (never its value)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import hvac
import hvac.exceptions
import requests
from temporalio.exceptions import ApplicationError

from activities import secrets as vault_secrets
from activities._clients import bad, unavailable
from activities.binding import implements
from activities.contracts.vault import (
    HEALTH,
    IDENTITY_KEYS,
    READ,
    HealthInput,
    HealthOutput,
    IdentityKeysInput,
    ReadInput,
    ReadOutput,
)
from activities.oidc import IdentityKeys
from activities.secrets import VaultSecretRef

__all__ = ["fetch_identity_keys", "health", "identity_keys", "read"]


@implements(HEALTH)
def health(inp: HealthInput) -> HealthOutput:
    # hvac hands timeout to requests, which takes seconds as a float; its hint says int.
    client = hvac.Client(url=inp.address, verify=inp.ca_cert or True,
                         timeout=inp.timeout_seconds)  # pyright: ignore[reportArgumentType]
    try:
        # Every state answers 200 so the body, not the status code, says what it is.
        body = client.sys.read_health_status(method="GET", standby_ok=True, sealed_code=200, uninit_code=200,
                                             performance_standby_code=200, dr_secondary_code=200)
    except (requests.RequestException, hvac.exceptions.VaultError) as exc:
        raise unavailable(f"Vault at {inp.address} unreachable: {type(exc).__name__}") from None
    if not isinstance(body, dict):
        body = body.json() if hasattr(body, "json") else {}
    out = HealthOutput(initialized=bool(body.get("initialized")), sealed=bool(body.get("sealed")),
                       standby=bool(body.get("standby")), version=body.get("version"),
                       cluster_name=body.get("cluster_name"))
    # Retryable: unsealing is exactly what an operator is about to do, and the gate should then pass.
    if not out.initialized:
        raise ApplicationError(f"Vault at {inp.address} is not initialized", out.model_dump(), type="VaultUninitialized")
    if out.sealed:
        raise ApplicationError(f"Vault at {inp.address} is sealed", out.model_dump(), type="VaultSealed")
    if out.standby and not inp.standby_ok:
        raise ApplicationError(f"Vault at {inp.address} is a standby", out.model_dump(), type="VaultStandby")
    return out


@implements(READ)
def read(inp: ReadInput) -> ReadOutput:
    login = VaultSecretRef(address=inp.address, mount=inp.mount, path=inp.path, field="-",
                           token_env=inp.token_env, token_file=inp.token_file, ca_cert=inp.ca_cert)
    # Same token lookup and client factory as activities.secrets, so tests and workers configure one thing.
    client = vault_secrets._factory(inp.address, vault_secrets._token(login), inp.ca_cert or True)
    where = f"{inp.mount}/{inp.path}"
    try:
        reply: dict[str, Any] = client.secrets.kv.v2.read_secret_version(
            path=inp.path, mount_point=inp.mount, version=inp.version, raise_on_deleted_version=True)
    except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized) as exc:
        raise ApplicationError(f"Vault denied reading {where}: {type(exc).__name__}", type="VaultAuth",
                               non_retryable=True) from None
    except hvac.exceptions.InvalidPath:
        raise ApplicationError(f"no secret at {where}", type="VaultMissing", non_retryable=True) from None
    except (requests.RequestException, hvac.exceptions.VaultError) as exc:
        raise unavailable(f"reading {where}: {type(exc).__name__}") from None
    data = (reply or {}).get("data") or {}
    keys = sorted((data.get("data") or {}).keys())
    meta = data.get("metadata") or {}
    missing = [k for k in inp.require_keys if k not in keys]
    if missing:
        raise bad(f"secret {where} lacks keys {missing} (has {keys})")
    refs = {k: login.model_copy(update={"field": k}) for k in keys}
    return ReadOutput(address=inp.address, mount=inp.mount, path=inp.path, version=int(meta.get("version") or 0),
                      keys=keys, created_time=meta.get("created_time"), refs=refs)


_HOW_TO_CONFIGURE = (
    "create a named key, a scope, a public client and a provider, e.g. `vault write identity/oidc/key/coldstart "
    "allowed_client_ids='*'`, `vault write identity/oidc/scope/coldstart template=...` (name: the entity's name), "
    "`vault write identity/oidc/client/coldstart-cli key=coldstart client_type=public ...` and "
    "`vault write identity/oidc/provider/coldstart scopes_supported=coldstart allowed_client_ids=<client_id>` "
    "(lab/identity.py does it for the lab)")


def fetch_identity_keys(inp: IdentityKeysInput) -> IdentityKeys:
    """Vault's OIDC issuer and public keys, read from the public discovery endpoints; ApplicationError otherwise."""
    # token="" : these endpoints are public, and the worker's own token (VAULT_TOKEN) must not travel.
    client = hvac.Client(url=inp.address, token="", verify=inp.ca_cert or True,
                         timeout=inp.timeout_seconds)  # pyright: ignore[reportArgumentType] - a float, as above
    base = f"/v1/identity/oidc/provider/{inp.provider}" if inp.provider else "/v1/identity/oidc"
    try:
        config = client.adapter.get(f"{base}/.well-known/openid-configuration")
        jwks = client.adapter.get(f"{base}/.well-known/keys")
    except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized, hvac.exceptions.InvalidPath) as exc:
        raise ApplicationError(f"Vault at {inp.address} refused its OIDC discovery endpoints ({base}): "
                               f"{type(exc).__name__}: {_HOW_TO_CONFIGURE}",
                               type="VaultIdentity", non_retryable=True) from None
    except (requests.RequestException, hvac.exceptions.VaultError) as exc:
        raise unavailable(f"Vault at {inp.address} unreachable: {type(exc).__name__}") from None
    issuer = config.get("issuer") if isinstance(config, dict) else None
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if not isinstance(issuer, str) or not issuer or not isinstance(keys, list):
        raise unavailable(f"Vault at {inp.address} answered its OIDC discovery endpoints without an issuer or keys")
    keys = [k for k in keys if isinstance(k, dict)]
    if not keys:
        raise ApplicationError(f"Vault at {inp.address} has no OIDC signing key, so no approver can prove who they "
                               f"are: {_HOW_TO_CONFIGURE}", type="VaultIdentityUnconfigured", non_retryable=True)
    return IdentityKeys(issuer=issuer, keys=keys, captured_at=datetime.now(UTC))


@implements(IDENTITY_KEYS)
def identity_keys(inp: IdentityKeysInput) -> IdentityKeys:
    return fetch_identity_keys(inp)
