"""Read one secret from Vault KV v2 inside an activity, so secrets never travel in workflow history."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hvac
import hvac.exceptions
from temporalio.exceptions import ApplicationError

from activities.contracts.targets import VaultSecretRef

__all__ = ["ClientFactory", "VaultSecretRef", "forget_cached_secrets", "read_kv_secret", "use_client_factory"]

# (url, token, verify) -> an hvac.Client or anything with the same `secrets.kv.v2` surface.
ClientFactory = Callable[[str, str, "bool | str"], Any]


def _hvac_client(url: str, token: str, verify: bool | str) -> Any:
    return hvac.Client(url=url, token=token, verify=verify)


_factory: ClientFactory = _hvac_client

# (ref, Vault token) -> (value, read at): per worker process, only for refs with cache_seconds > 0.
_cache: dict[tuple[str, str], tuple[str, float]] = {}
_cache_lock = threading.Lock()


def forget_cached_secrets() -> int:
    """Drop every cached value (a cluster refused a cached token: the next use reads Vault again)."""
    with _cache_lock:
        count = len(_cache)
        _cache.clear()
    return count


@contextlib.contextmanager
def use_client_factory(factory: ClientFactory) -> Iterator[None]:
    """Swap the Vault client factory (tests); restores the previous one on exit."""
    global _factory
    previous, _factory = _factory, factory
    forget_cached_secrets()
    try:
        yield
    finally:
        _factory = previous
        forget_cached_secrets()


def _token(ref: VaultSecretRef) -> str:
    if ref.token_file:
        try:
            token = Path(ref.token_file).read_text().strip()
        except OSError as exc:
            raise ApplicationError(
                f"cannot read Vault token file {ref.token_file}: {exc.strerror}",
                type="VaultAuth",
                non_retryable=True,
            ) from None
    else:
        token = os.environ.get(ref.token_env, "").strip()
    if not token:
        where = ref.token_file or f"${ref.token_env}"
        raise ApplicationError(f"no Vault token in {where}", type="VaultAuth", non_retryable=True)
    return token


def read_kv_secret(ref: VaultSecretRef, *, token: str | None = None) -> str:
    """Return the field's value. Blocking (hvac is sync): call it via asyncio.to_thread.

    Errors never carry the value; permission and missing-path errors are non-retryable,
    connection trouble is left retryable because Vault may just be coming back up. A ref with
    `cache_seconds` is read once per that many seconds per worker (keyed by the login token too,
    so a rotated Vault token reads again). `token`: the Vault login to read with, where the caller
    holds one of its own (readiness's AppRole login); else the reference's token_file or token_env.
    """
    token = token or _token(ref)
    if ref.cache_seconds <= 0:
        return _read(ref, token)
    key = (ref.model_dump_json(), token)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and time.monotonic() - hit[1] < ref.cache_seconds:
        return hit[0]
    value = _read(ref, token)
    with _cache_lock:
        _cache[key] = (value, time.monotonic())
    return value


def _read(ref: VaultSecretRef, token: str) -> str:
    client = _factory(ref.address, token, ref.ca_cert or True)
    where = f"{ref.mount.strip('/')}/{ref.path.strip('/')}"
    try:
        reply = client.secrets.kv.v2.read_secret_version(
            path=ref.path.strip("/"), mount_point=ref.mount.strip("/"), raise_on_deleted_version=True
        )
    except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized) as exc:
        raise ApplicationError(
            f"Vault denied reading {where}: {type(exc).__name__}", type="VaultAuth", non_retryable=True
        ) from None
    except hvac.exceptions.InvalidPath:
        raise ApplicationError(f"no secret at {where}", type="VaultMissing", non_retryable=True) from None
    data = ((reply or {}).get("data") or {}).get("data") or {}
    value = data.get(ref.field)
    if not isinstance(value, str) or not value:
        raise ApplicationError(
            f"secret {where} has no non-empty string field {ref.field!r}", type="VaultMissing", non_retryable=True
        )
    return value
