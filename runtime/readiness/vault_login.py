"""Secrets are checked with the worker's own Vault login: $VAULT_TOKEN, else the target's AppRole."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from activities.inventory import Inventory

__all__ = ["worker_vault_token"]

_TOKEN_ENV = "VAULT_TOKEN"


@contextlib.asynccontextmanager
async def worker_vault_token(target: dict, *, timeout: float = 5.0) -> AsyncIterator[str]:
    """While open, $VAULT_TOKEN is what the worker reads secrets with. A token already set is used as it is
    (a worker's); else the inventory's AppRole logs in and its token is revoked on exit. Yields where the
    token came from. A failed login leaves $VAULT_TOKEN unset: the secret checks then say so, and the
    `vault.approle` check says why."""
    if os.environ.get(_TOKEN_ENV, "").strip():
        yield f"${_TOKEN_ENV}"
        return
    login = Inventory.model_validate(target).vault if "telemetry" in target else None
    if login is None:
        yield "no Vault login"
        return
    address = login.address.rstrip("/")
    token = await _approle_token(address, login.approle_role_id_file, login.approle_secret_id_file, timeout)
    if token is None:
        yield "no Vault login"
        return
    os.environ[_TOKEN_ENV] = token
    try:
        yield "the target's AppRole"
    finally:
        if os.environ.get(_TOKEN_ENV) == token:
            del os.environ[_TOKEN_ENV]
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=timeout) as http:
                await http.post(f"{address}/v1/auth/token/revoke-self", headers={"X-Vault-Token": token})


async def _approle_token(address: str, role_id_file: str, secret_id_file: str, timeout: float) -> str | None:
    try:
        role_id = Path(role_id_file).read_text().strip()
        secret_id = Path(secret_id_file).read_text().strip()
    except OSError:
        return None
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            reply = await http.post(f"{address}/v1/auth/approle/login",
                                    json={"role_id": role_id, "secret_id": secret_id})
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    try:
        token = ((reply.json() or {}).get("auth") or {}).get("client_token")
    except ValueError:
        return None
    return token if isinstance(token, str) and token else None
