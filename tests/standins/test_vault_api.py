"""Vault stand-in exercised through hvac: sys/health, lookup-self, AppRole login, KV v2."""

from __future__ import annotations

import hvac
import pytest
import requests
from hvac.exceptions import Forbidden, InvalidPath, InvalidRequest

from .conftest import start_vault


def test_sys_health_status_codes(vault_lab):
    c = hvac.Client(url=vault_lab.url)
    health = c.sys.read_health_status(method="GET")
    assert health["initialized"] is True and health["sealed"] is False and health["standby"] is False
    requests.post(f"{vault_lab.url}/_lab/faults", json={"fault": "standby"}, timeout=10)
    assert c.sys.read_health_status(method="GET").status_code == 429
    assert requests.get(f"{vault_lab.url}/v1/sys/health?standbyok=true", timeout=10).status_code == 200
    requests.post(f"{vault_lab.url}/_lab/faults", json={"fault": "sealed"}, timeout=10)
    sealed = c.sys.read_health_status(method="GET")
    assert sealed.status_code == 503 and sealed.json()["sealed"] is True
    assert requests.head(f"{vault_lab.url}/v1/sys/health", timeout=10).status_code == 503
    assert c.sys.read_health_status(method="GET", sealed_code=200)["sealed"] is True
    with pytest.raises(hvac.exceptions.VaultDown):
        hvac.Client(url=vault_lab.url, token="root-token").auth.token.lookup_self()
    requests.delete(f"{vault_lab.url}/_lab/faults", timeout=10)
    assert c.sys.read_health_status(method="GET")["sealed"] is False


def test_token_lookup_self_and_approle_login(vault_lab):
    root = hvac.Client(url=vault_lab.url, token="root-token")
    assert root.auth.token.lookup_self()["data"]["policies"] == ["root"]
    app = hvac.Client(url=vault_lab.url)
    resp = app.auth.approle.login(role_id="role-123", secret_id="secret-456")
    token = resp["auth"]["client_token"]
    assert app.token == token and resp["auth"]["lease_duration"] > 0
    assert "coldstart" in resp["auth"]["policies"]
    me = app.auth.token.lookup_self()["data"]
    assert me["id"] == token and me["meta"] == {"role_name": "coldstart"} and me["ttl"] > 0
    assert app.is_authenticated()
    with pytest.raises(InvalidRequest):
        hvac.Client(url=vault_lab.url).auth.approle.login(role_id="role-123", secret_id="wrong")
    with pytest.raises(InvalidRequest):
        hvac.Client(url=vault_lab.url).auth.approle.login(role_id="nope", secret_id="secret-456")
    with pytest.raises(Forbidden):
        hvac.Client(url=vault_lab.url, token="bogus").auth.token.lookup_self()
    assert not hvac.Client(url=vault_lab.url, token="bogus").is_authenticated()


def test_kv_v2_read_write_versions_metadata_cas(vault_lab):
    c = hvac.Client(url=vault_lab.url, token="root-token")
    kv = c.secrets.kv.v2
    assert kv.create_or_update_secret("coldstart/db", {"password": "one"})["data"]["version"] == 1
    assert kv.create_or_update_secret("coldstart/db", {"password": "two"}, cas=1)["data"]["version"] == 2
    with pytest.raises(InvalidRequest):
        kv.create_or_update_secret("coldstart/db", {"password": "three"}, cas=1)
    latest = kv.read_secret_version("coldstart/db", raise_on_deleted_version=True)["data"]
    assert latest["data"] == {"password": "two"} and latest["metadata"]["version"] == 2
    assert kv.read_secret_version("coldstart/db", version=1, raise_on_deleted_version=True)["data"]["data"] == {
        "password": "one"}
    meta = kv.read_secret_metadata("coldstart/db")["data"]
    assert meta["current_version"] == 2 and set(meta["versions"]) == {"1", "2"}
    keys = requests.get(f"{vault_lab.url}/v1/secret/metadata/coldstart?list=true",
                        headers={"X-Vault-Token": "root-token"}, timeout=10).json()["data"]["keys"]
    assert keys == ["db"]
    raw = requests.post(f"{vault_lab.url}/v1/secret/data/coldstart/raw", json={"data": {"k": "v"}},
                        headers={"X-Vault-Token": "root-token"}, timeout=10)
    assert raw.status_code == 200 and raw.json()["data"]["version"] == 1
    kv.delete_latest_version_of_secret("coldstart/db")
    with pytest.raises(InvalidPath):
        kv.read_secret_version("coldstart/db", raise_on_deleted_version=True)
    with pytest.raises(InvalidPath):
        kv.read_secret_version("nothing/here", raise_on_deleted_version=True)
    with pytest.raises(Forbidden):
        hvac.Client(url=vault_lab.url, token="bogus").secrets.kv.v2.read_secret_version(
            "coldstart/db", raise_on_deleted_version=True)


def test_state_dir_keeps_secrets(tmp_path):
    lab = start_vault(tmp_path)
    try:
        hvac.Client(url=lab.url, token="root-token").secrets.kv.v2.create_or_update_secret("p", {"a": "b"})
    finally:
        lab.server.stop()
    lab2 = start_vault(tmp_path)
    try:
        got = hvac.Client(url=lab2.url, token="root-token").secrets.kv.v2.read_secret_version(
            "p", raise_on_deleted_version=True)
        assert got["data"]["data"] == {"a": "b"}
    finally:
        lab2.server.stop()


def test_seal_and_unseal_as_a_dev_server(vault_lab):
    """sys/seal with a root token, sys/unseal with the single key share; sealed, health says so as Vault does."""
    root = hvac.Client(url=vault_lab.url, token="root-token")
    with pytest.raises(Forbidden):
        hvac.Client(url=vault_lab.url, token="bogus").sys.seal()
    root.sys.seal()
    sealed = requests.get(f"{vault_lab.url}/v1/sys/health", timeout=10)
    assert sealed.status_code == 503
    assert sealed.json()["sealed"] is True and sealed.json()["standby"] is True and "cluster_name" not in sealed.json()
    with pytest.raises(hvac.exceptions.VaultDown):
        root.secrets.kv.v2.read_secret_version("anything", raise_on_deleted_version=True)
    with pytest.raises(InvalidRequest):
        root.sys.submit_unseal_key(key="not-the-key")
    assert root.sys.read_seal_status()["sealed"] is True
    status = root.sys.submit_unseal_key(key=vault_lab.state.unseal_key)
    assert status["sealed"] is False and (status["t"], status["n"]) == (1, 1)
    assert root.sys.read_health_status(method="GET")["sealed"] is False
