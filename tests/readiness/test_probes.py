"""Readiness probes against real servers: Prometheus's live config, Consul snapshots, Vault secrets and AppRole."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import hvac

from activities.consul.archive import read_meta, taken_at
from activities.contracts.targets import VaultSecretRef
from lab.hashistack.local import VaultDev
from runtime.readiness.endpoints import approle_verdict, endpoint_verdict, secret_verdict
from runtime.readiness.snapshots import snapshot_verdict
from runtime.readiness.telemetry import config_dependencies, telemetry_verdict
from tests.readiness.archives import with_state
from tests.readiness.conftest import SECRET
from tests.readiness.servers import prometheus

STATIC = """
global: {scrape_interval: 15s}
scrape_configs:
  - job_name: node
    static_configs: [{targets: ['10.0.0.9:9100']}]
"""

CONSUL_SD = """
global: {scrape_interval: 15s}
scrape_configs:
  - job_name: node
    static_configs: [{targets: ['10.0.0.9:9100']}]
  - job_name: cache
    dns_sd_configs: [{names: [cache.service.consul], type: SRV}]
  - job_name: game
    static_configs: [{targets: ['game.service.consul:9102']}]
"""


async def test_live_prometheus_config_without_consul_is_ready(tmp_path: Path) -> None:
    with prometheus(tmp_path, STATIC) as url:
        verdict = await telemetry_verdict(url)
    assert verdict.state == "ready", verdict.evidence
    assert url in verdict.evidence


async def test_a_job_on_consul_discovery_or_a_consul_name_is_not_ready(tmp_path: Path) -> None:
    with prometheus(tmp_path, CONSUL_SD) as url:
        verdict = await telemetry_verdict(url)
    assert verdict.state == "not_ready"
    assert "names cache.service.consul" in verdict.evidence
    assert "names game.service.consul" in verdict.evidence
    assert "10.0.0.9" not in verdict.evidence


def test_consul_and_nomad_discovery_in_a_config_are_dependencies() -> None:
    """Debian's Prometheus is built without Consul and Nomad discovery, so this one is read from the text."""
    found = config_dependencies(
        "scrape_configs:\n"
        "  - job_name: cache\n    consul_sd_configs: [{server: '10.0.0.5:8500'}]\n"
        "  - job_name: jobs\n    nomad_sd_configs: [{server: 'http://10.0.0.6:4646'}]\n"
        "  - job_name: node\n    static_configs: [{targets: ['consul:8500', 'a.example.com:9100']}]\n"
        "alerting:\n  alertmanagers: [{consul_sd_configs: [{server: '10.0.0.5:8500'}]}]\n")
    assert found == ["job cache uses consul_sd_configs", "job jobs uses nomad_sd_configs",
                     "config uses consul_sd_configs"]


async def test_a_prometheus_that_does_not_answer_is_not_ready_and_an_endpoint_that_answers_is_ready(
        tmp_path: Path) -> None:
    with prometheus(tmp_path, STATIC) as url:
        assert (await endpoint_verdict(url)).state == "ready"
    assert (await telemetry_verdict(url, timeout=2)).state == "not_ready"
    gone = await endpoint_verdict(url, timeout=2)
    assert gone.state == "not_ready" and "not reachable" in gone.evidence


def _store(tmp_path: Path, *files: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    for f in files:
        (store / f.name).write_bytes(f.read_bytes())
    return store


def _flip(state: bytes) -> bytes:
    """One byte of state.bin flipped."""
    changed = bytearray(state)
    changed[len(changed) // 2] ^= 0xFF
    return bytes(changed)


async def test_the_newest_snapshot_within_the_objective_verifies_and_decodes(snapshot: Path, tmp_path: Path) -> None:
    verdict = await snapshot_verdict(str(_store(tmp_path, snapshot)), objective=timedelta(hours=24))
    assert verdict.state == "ready", verdict.evidence
    assert "SHA256SUMS verified" in verdict.evidence
    assert "(within the objective 24h)" in verdict.evidence
    assert "3 keys decoded" in verdict.evidence


async def test_a_snapshot_older_than_the_objective_is_not_ready(snapshot: Path, tmp_path: Path) -> None:
    later = taken_at(read_meta(snapshot)) + timedelta(hours=30)
    verdict = await snapshot_verdict(str(_store(tmp_path, snapshot)), objective=timedelta(hours=24), now=later)
    assert verdict.state == "not_ready"
    assert "30h old, older than the objective 24h" in verdict.evidence


async def test_a_corrupt_newest_snapshot_is_not_ready(snapshot: Path, tmp_path: Path) -> None:
    store = _store(tmp_path, snapshot)
    with_state(snapshot, store / "consul-2.snap", _flip, later_ms=60_000)  # a minute after consul-1.snap
    verdict = await snapshot_verdict(str(store), objective=timedelta(hours=24))
    assert verdict.state == "not_ready"
    assert verdict.evidence == ("the newest snapshot does not verify or decode: consul-2.snap: sha256 mismatch for "
                                "state.bin (corrupt or altered)")
    # The same minute-later archive with its state intact is the newest, and verifies: only the flip failed it.
    with_state(snapshot, store / "consul-2.snap", lambda state: state, later_ms=60_000)
    intact = await snapshot_verdict(str(store), objective=timedelta(hours=24))
    assert intact.state == "ready" and intact.evidence.startswith("consul-2.snap is "), intact.evidence


async def test_an_empty_store_is_not_ready(tmp_path: Path) -> None:
    verdict = await snapshot_verdict(str(_store(tmp_path)), now=datetime.now(UTC))
    assert verdict.state == "not_ready" and "no readable snapshot" in verdict.evidence


def _ref(vault: VaultDev, tmp_path: Path, **fields: str) -> VaultSecretRef:
    token = tmp_path / "token"
    token.write_text(vault.token)
    return VaultSecretRef.model_validate({"address": vault.url, "path": "coldstart/dns", "field": "tsig",
                                          "token_file": str(token), **fields})


async def test_a_secret_that_resolves_is_ready_and_never_printed(vault: VaultDev, tmp_path: Path) -> None:
    verdict = await secret_verdict(_ref(vault, tmp_path))
    assert verdict.state == "ready", verdict.evidence
    assert SECRET not in verdict.evidence
    assert "coldstart/dns field tsig" in verdict.evidence


async def test_a_missing_secret_or_field_is_not_ready(vault: VaultDev, tmp_path: Path) -> None:
    missing = await secret_verdict(_ref(vault, tmp_path, path="coldstart/nothing"))
    assert missing.state == "not_ready" and "no secret at secret/coldstart/nothing" in missing.evidence
    field = await secret_verdict(_ref(vault, tmp_path, field="other"))
    assert field.state == "not_ready" and SECRET not in field.evidence


async def test_the_approle_logs_in_or_is_refused(vault: VaultDev, tmp_path: Path) -> None:
    admin = hvac.Client(url=vault.url, token=vault.token)
    role_id = admin.auth.approle.read_role_id("worker")["data"]["role_id"]
    secret_id = admin.auth.approle.generate_secret_id("worker")["data"]["secret_id"]
    (tmp_path / "role").write_text(role_id)
    (tmp_path / "secret").write_text(secret_id)
    verdict = await approle_verdict(vault.url, str(tmp_path / "role"), str(tmp_path / "secret"))
    assert verdict.state == "ready", verdict.evidence
    (tmp_path / "secret").write_text("not-the-secret-id")
    refused = await approle_verdict(vault.url, str(tmp_path / "role"), str(tmp_path / "secret"))
    assert refused.state == "not_ready" and "refused" in refused.evidence
    assert secret_id not in refused.evidence and "not-the-secret-id" not in refused.evidence


async def test_a_sealed_vault_leaves_every_secret_not_ready(vault: VaultDev, tmp_path: Path) -> None:
    admin = hvac.Client(url=vault.url, token=vault.token)
    admin.sys.seal()
    try:
        sealed = await secret_verdict(_ref(vault, tmp_path))
    finally:
        admin.sys.submit_unseal_key(vault.unseal_key())
    assert sealed.state == "not_ready" and "does not resolve" in sealed.evidence, sealed.evidence
    assert SECRET not in sealed.evidence
    assert (await secret_verdict(_ref(vault, tmp_path))).state == "ready"
