"""The steering key's readiness against a real PowerDNS: its secret from a real Vault signs an UPDATE pdns accepts."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path

import hvac
import pytest

from activities.inventory import DnsSteering
from lab.dns import PdnsLab, PdnsSettings, free_dns_port, prepare, start, stop
from lab.hashistack.local import VaultDev
from runtime.readiness.dns import tsig_verdict
from tests.real import unavailable


@pytest.fixture(scope="module")
def pdns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdnsLab]:
    if shutil.which("pdns_server", path="/usr/sbin:/usr/bin") is None:
        unavailable("pdns_server not installed (apt-get install pdns-server pdns-backend-sqlite3)")
    lab = prepare(tmp_path_factory.mktemp("pdns"), PdnsSettings(port=free_dns_port(), start_percent=0))
    proc = start(lab)
    try:
        yield lab
    finally:
        stop(proc)


def _steering(pdns: PdnsLab, vault: VaultDev, tmp_path: Path, *, name: str = "play") -> DnsSteering:
    token = tmp_path / "token"
    token.write_text(vault.token)
    return DnsSteering.model_validate({
        "zone": pdns.settings.zone, "name": name, "servers": [f"127.0.0.1:{pdns.settings.port}"],
        "game_ip": "10.20.0.10", "maint_ip": "10.20.0.99", "tsig_key_name": pdns.key.name,
        "tsig_secret": {"address": vault.url, "path": "coldstart/pdns-tsig", "field": "secret", "token_file": str(token)}})


def _store(vault: VaultDev, secret: str) -> None:
    hvac.Client(url=vault.url, token=vault.token).secrets.kv.v2.create_or_update_secret(
        path="coldstart/pdns-tsig", secret={"secret": secret})


async def test_the_steering_key_signs_an_update_pdns_accepts(pdns: PdnsLab, vault: VaultDev, tmp_path: Path) -> None:
    _store(vault, pdns.key.secret)
    verdict = await tsig_verdict(_steering(pdns, vault, tmp_path))
    assert verdict.state == "ready", verdict.evidence
    assert pdns.key.secret not in verdict.evidence


async def test_a_wrong_key_in_vault_is_not_ready(pdns: PdnsLab, vault: VaultDev, tmp_path: Path) -> None:
    wrong = base64.b64encode(b"w" * 32).decode()
    _store(vault, wrong)
    verdict = await tsig_verdict(_steering(pdns, vault, tmp_path))
    assert verdict.state == "not_ready"
    assert "refused the key" in verdict.evidence, verdict.evidence
    assert wrong not in verdict.evidence and pdns.key.secret not in verdict.evidence


async def test_a_missing_key_or_name_is_not_ready(pdns: PdnsLab, vault: VaultDev, tmp_path: Path) -> None:
    _store(vault, pdns.key.secret)
    nameless = await tsig_verdict(_steering(pdns, vault, tmp_path, name="nothing-here"))
    assert nameless.state == "not_ready" and "has no nothing-here" in nameless.evidence, nameless.evidence
    hvac.Client(url=vault.url, token=vault.token).secrets.kv.v2.delete_metadata_and_all_versions("coldstart/pdns-tsig")
    missing = await tsig_verdict(_steering(pdns, vault, tmp_path))
    assert missing.state == "not_ready" and "does not resolve in Vault" in missing.evidence
