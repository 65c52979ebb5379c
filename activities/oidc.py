"""Vault's OIDC discovery data as a run keeps it: the issuer and public keys that verify identity tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["DECISION_REDIRECT_URI", "IDENTITY_KEYS_ACTION", "IdentityKeys"]

# The action that captures them (activities/vault.identity_keys), named here for the workflow and the loader too.
IDENTITY_KEYS_ACTION = "vault.identity_keys"
# The redirect URI of the public OIDC client that fetches decision tokens: nothing is redirected (Vault's API
# answers the code as JSON), but Vault requires the client to register one and checks it.
DECISION_REDIRECT_URI = "http://127.0.0.1/coldstart"


class IdentityKeys(BaseModel):
    """Vault's OIDC issuer and public keys, captured by an activity at run start."""

    issuer: str = Field(description="`issuer` of /v1/identity/oidc/.well-known/openid-configuration")
    keys: list[dict[str, Any]] = Field(
        description='the JWKS "keys" array of /v1/identity/oidc/.well-known/keys, as served')
    captured_at: datetime
