"""Secrets are checked with the worker's own Vault login: $VAULT_TOKEN, else the target's AppRole."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from activities.errors import Refused
from activities.inventory import Inventory

__all__ = ["AppRoleRefused", "approle_login", "worker_vault_token"]

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
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            token = await approle_login(http, address, login.approle_role_id_file, login.approle_secret_id_file)
    except AppRoleRefused:
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


class AppRoleRefused(Refused):
    """The AppRole did not log in; the message says why, never with a secret."""


async def approle_login(http: httpx.AsyncClient, address: str, role_id_file: str, secret_id_file: str) -> str:
    """The token the AppRole logs in with (the caller revokes it); AppRoleRefused saying why it did not."""
    try:
        role_id = Path(role_id_file).read_text().strip()
        secret_id = Path(secret_id_file).read_text().strip()
    except OSError as exc:
        raise AppRoleRefused(f"cannot read the AppRole credentials: {exc.filename}: {exc.strerror}") from None
    try:
        reply = await http.post(f"{address.rstrip('/')}/v1/auth/approle/login",
                                json={"role_id": role_id, "secret_id": secret_id})
    except httpx.TransportError as exc:
        raise AppRoleRefused(f"Vault at {address} is not reachable: {type(exc).__name__}") from None
    body = _json(reply)
    if reply.status_code != 200:
        errors = "; ".join(str(e) for e in (body.get("errors") or [])) or f"HTTP {reply.status_code}"
        raise AppRoleRefused(f"the AppRole login at {address} is refused: {errors}")
    token = (body.get("auth") or {}).get("client_token")
    if not isinstance(token, str) or not token:
        raise AppRoleRefused(f"the AppRole login at {address} returned no token")
    return token


def _json(reply: httpx.Response) -> dict:
    try:
        body = reply.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
