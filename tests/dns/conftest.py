"""Fixtures for the DNS steering tests: one real pdns_server on loopback and a fake Vault."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from activities.secrets import use_client_factory
from lab.dns import PdnsLab, PdnsSettings, free_dns_port, prepare, start, stop
from tests.dns.support import GAME_IP, MAINT_IP, FakeVault
from tests.real import unavailable


@pytest.fixture(scope="session")
def pdns_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdnsLab]:
    if shutil.which("pdns_server", path="/usr/sbin:/usr/bin") is None:
        unavailable("pdns_server not installed (apt-get install pdns-server pdns-backend-sqlite3)")
    settings = PdnsSettings(port=free_dns_port(), game_ip=GAME_IP, maint_ip=MAINT_IP, start_percent=0)
    lab = prepare(tmp_path_factory.mktemp("pdns"), settings)
    proc = start(lab)
    try:
        yield lab
    finally:
        stop(proc)
        # Nothing may outlive the suite.
        assert proc.popen is not None and proc.popen.poll() is not None


@pytest.fixture
def vault(pdns_lab: PdnsLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVault]:
    monkeypatch.setenv("VAULT_TOKEN", "test-token")
    fake = FakeVault(pdns_lab.key.secret)
    with use_client_factory(fake.factory):
        yield fake
