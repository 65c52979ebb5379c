"""Vault KV reads inside activities: per-worker reuse only where a ref asks for it, on a real Vault dev server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import consul.exceptions as cex
import hvac
import pytest

from activities._clients import translate
from activities.secrets import VaultSecretRef, forget_cached_secrets, read_kv_secret
from lab.hashistack.local import VaultDev


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultDev]:
    server = VaultDev(tmp_path_factory.mktemp("vault")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def admin(vault: VaultDev) -> Iterator[hvac.Client]:
    forget_cached_secrets()
    yield hvac.Client(url=vault.url, token=vault.token)
    forget_cached_secrets()


def _ref(vault: VaultDev, tmp_path: Path, token: str, **extra: float) -> VaultSecretRef:
    token_file = tmp_path / f"token-{token[-6:]}"
    token_file.write_text(token + "\n")
    return VaultSecretRef(address=vault.url, path="coldstart/consul", field="token", token_file=str(token_file), **extra)


def _put(admin: hvac.Client, value: str) -> None:
    admin.secrets.kv.v2.create_or_update_secret(path="coldstart/consul", secret={"token": value})


def test_a_ref_without_cache_reads_vault_every_time(vault: VaultDev, admin: hvac.Client, tmp_path: Path) -> None:
    ref = _ref(vault, tmp_path, vault.token)
    _put(admin, "first")
    assert read_kv_secret(ref) == "first"
    _put(admin, "second")
    assert read_kv_secret(ref) == "second"


def test_a_cached_ref_is_read_once_per_period_and_per_login_token(vault: VaultDev, admin: hvac.Client,
                                                                   tmp_path: Path) -> None:
    # A period far longer than the Vault calls inside it take on a loaded machine.
    ref = _ref(vault, tmp_path, vault.token, cache_seconds=3)
    _put(admin, "first")
    assert read_kv_secret(ref) == "first"
    _put(admin, "rotated")
    assert read_kv_secret(ref) == "first"  # reused within the period: no Vault round trip
    # Another login token (a worker re-authenticated) is another cache entry: it reads Vault.
    other = admin.auth.token.create(policies=["root"], ttl="5m")["auth"]["client_token"]
    assert read_kv_secret(_ref(vault, tmp_path, other, cache_seconds=3)) == "rotated"
    time.sleep(3.1)
    assert read_kv_secret(ref) == "rotated"  # the period ran out


def test_a_refusal_by_the_cluster_drops_cached_tokens_and_may_be_retried(vault: VaultDev, admin: hvac.Client,
                                                                         tmp_path: Path) -> None:
    denied = cex.ACLPermissionDenied("ACL not found")
    error = translate("write KV x", denied)
    assert error.type == "PermissionDenied" and error.non_retryable  # nothing cached: a real refusal

    ref = _ref(vault, tmp_path, vault.token, cache_seconds=60)
    _put(admin, "stale")
    assert read_kv_secret(ref) == "stale"
    _put(admin, "fresh")
    error = translate("write KV x", denied)
    assert error.type == "PermissionDenied" and not error.non_retryable
    assert "cached tokens dropped" in str(error)
    assert read_kv_secret(ref) == "fresh"  # the retry reads Vault again
