"""Servers the readiness tests share: a snapshot a real Consul agent took, a Vault dev server with a secret and an AppRole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import hvac
import pytest

from lab.hashistack.local import VaultDev
from tests.readiness.servers import consul_dev


@pytest.fixture(scope="session")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot a real Consul agent took, with three keys."""
    tmp = tmp_path_factory.mktemp("consul")
    with consul_dev(tmp / "agent") as url:
        for key in ("app/a", "app/b", "app/c"):
            httpx.put(f"{url}/v1/kv/{key}", content=b"value", timeout=5).raise_for_status()
        reply = httpx.get(f"{url}/v1/snapshot", timeout=30)
        reply.raise_for_status()
    path = tmp / "consul-1.snap"
    path.write_bytes(reply.content)
    return path


SECRET = "tsig-secret-value-never-printed"


@pytest.fixture(scope="session")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultDev]:
    server = VaultDev(tmp_path_factory.mktemp("vault")).start()
    try:
        admin = hvac.Client(url=server.url, token=server.token)
        admin.secrets.kv.v2.create_or_update_secret(path="coldstart/dns", secret={"tsig": SECRET})
        admin.sys.enable_auth_method("approle")
        admin.auth.approle.create_or_update_approle("worker", token_policies=["default"])
        yield server
    finally:
        server.stop()


