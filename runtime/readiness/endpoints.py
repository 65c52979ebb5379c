"""Endpoints answer from here, and secret references resolve, without a secret ever reaching the evidence."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import httpx
from temporalio.exceptions import ApplicationError

from activities.contracts.targets import VaultSecretRef
from activities.secrets import read_kv_secret
from runtime.readiness.model import Verdict, not_ready, ready

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


async def secret_verdict(ref: VaultSecretRef) -> Verdict:
    where = f"{ref.mount.strip('/')}/{ref.path.strip('/')} field {ref.field} in {ref.address}"
    try:
        value = await asyncio.to_thread(read_kv_secret, ref.model_copy(update={"cache_seconds": 0}))
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
        role_id = Path(role_id_file).read_text().strip()
        secret_id = Path(secret_id_file).read_text().strip()
    except OSError as exc:
        return not_ready(f"cannot read the AppRole credentials: {exc.filename}: {exc.strerror}")
    base = address.rstrip("/")
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            reply = await http.post(f"{base}/v1/auth/approle/login", json={"role_id": role_id, "secret_id": secret_id})
            if reply.status_code != 200:
                errors = "; ".join(str(e) for e in (_json(reply).get("errors") or [])) or f"HTTP {reply.status_code}"
                return not_ready(f"the AppRole login at {address} is refused: {errors}")
            token = (_json(reply).get("auth") or {}).get("client_token")
            if token:
                await http.post(f"{base}/v1/auth/token/revoke-self", headers={"X-Vault-Token": token})
    except httpx.TransportError as exc:
        return not_ready(f"Vault at {address} is not reachable: {type(exc).__name__}")
    return ready(f"the AppRole logs in to {address}")


def _json(reply: httpx.Response) -> dict:
    try:
        body = reply.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
