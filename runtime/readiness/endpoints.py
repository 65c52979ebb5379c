"""Endpoints answer from here, and secret references resolve, without a secret ever reaching the evidence."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time

import httpx
from temporalio.exceptions import ApplicationError

from activities.contracts.targets import VaultSecretRef
from activities.secrets import read_kv_secret
from runtime.readiness.model import Verdict, not_ready, ready
from runtime.readiness.vault_login import AppRoleRefused, approle_login

__all__ = ["approle_verdict", "endpoint_verdict", "secret_verdict"]


async def endpoint_verdict(url: str, *, timeout: float = 5.0, ca_cert: str | None = None) -> Verdict:
    """Any HTTP answer proves the path (this host to that listener); a refused or silent connection is not ready."""
    try:
        verify = ssl.create_default_context(cafile=ca_cert) if ca_cert else True
    except OSError as exc:  # a CA bundle that cannot be read or parsed
        return not_ready(f"cannot read the CA bundle {ca_cert} for {url}: {exc.strerror or exc}")
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(timeout=timeout, verify=verify) as http:
            reply = await http.get(url)
    except httpx.TransportError as exc:
        return not_ready(f"{url} is not reachable from here: {type(exc).__name__}{_detail(exc)}")
    return ready(f"{url} answered HTTP {reply.status_code} in {(time.monotonic() - started) * 1000:.0f}ms")


def _detail(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f" ({text[0]})" if text else ""


async def secret_verdict(ref: VaultSecretRef, *, token: str | None = None) -> Verdict:
    """`token`: the Vault login to read with (the worker's AppRole); None: the reference's own."""
    where = f"{ref.mount.strip('/')}/{ref.path.strip('/')} field {ref.field} in {ref.address}"
    try:
        value = await asyncio.to_thread(read_kv_secret, ref.model_copy(update={"cache_seconds": 0}), token=token)
    except ApplicationError as exc:  # read_kv_secret's messages never carry the value
        return not_ready(f"{where} does not resolve: {exc.message}")
    except Exception as exc:  # noqa: BLE001 - hvac's connection and sealed-Vault errors, named by type only
        return not_ready(f"{where} does not resolve: {type(exc).__name__}")
    if not value:
        return not_ready(f"{where} resolves to an empty value")
    return ready(f"{where} resolves")


async def approle_verdict(address: str, role_id_file: str, secret_id_file: str, *, timeout: float = 5.0) -> Verdict:
    """The worker's AppRole logs in; the token it gets is revoked at once."""
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            token = await approle_login(http, address, role_id_file, secret_id_file)
            with contextlib.suppress(httpx.HTTPError):
                await http.post(f"{address.rstrip('/')}/v1/auth/token/revoke-self", headers={"X-Vault-Token": token})
    except AppRoleRefused as exc:
        return not_ready(str(exc))
    return ready(f"the AppRole logs in to {address}")
