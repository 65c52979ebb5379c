"""Secrets are checked with the worker's own Vault login: $VAULT_TOKEN, else the target's AppRole."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from activities.contracts.targets import VaultSecretRef
from activities.errors import Refused
from activities.inventory import Inventory

__all__ = ["AppRoleRefused", "WorkerVaultLogin", "approle_login", "worker_vault_token"]

_TOKEN_ENV = "VAULT_TOKEN"


@dataclass(frozen=True)
class WorkerVaultLogin:
    """What the readiness checks read Vault with. `token` is the target's AppRole login, handed to the checks
    explicitly: the process's environment is shared by every activity of the worker, whatever its target, so
    the token never goes there. None: each reference's own token source ($VAULT_TOKEN, a token file)."""

    source: str
    token: str | None = field(default=None, repr=False)

    def token_for(self, ref: VaultSecretRef) -> str | None:
        """The token to read `ref` with: the AppRole's where the reference reads $VAULT_TOKEN (the worker's
        own login, which the AppRole stands in for); None where it names another source, or there is no login."""
        if self.token is None or ref.token_file or ref.token_env != _TOKEN_ENV:
            return None
        return self.token


@contextlib.asynccontextmanager
async def worker_vault_token(target: dict, *, timeout: float = 5.0) -> AsyncIterator[WorkerVaultLogin]:
    """The login the checks read secrets with while open. A $VAULT_TOKEN already set is used as it is (a
    worker's); else the inventory's AppRole logs in, and its token is revoked on exit. A failed login gives no
    token: the secret checks then say so, and the `vault.approle` check says why."""
    if os.environ.get(_TOKEN_ENV, "").strip():
        yield WorkerVaultLogin(f"${_TOKEN_ENV}")
        return
    login = Inventory.model_validate(target).vault if "telemetry" in target else None
    if login is None:
        yield WorkerVaultLogin("no Vault login")
        return
    address = login.address.rstrip("/")
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            token = await approle_login(http, address, login.approle_role_id_file, login.approle_secret_id_file)
    except AppRoleRefused:
        yield WorkerVaultLogin("no Vault login")
        return
    try:
        yield WorkerVaultLogin("the target's AppRole", token)
    finally:
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
