"""The target's AppRole login reaches the readiness checks as an argument, never through the worker's environment:
every activity of a worker shares its process, whatever target it acts on."""

from __future__ import annotations

import os
from pathlib import Path

import hvac
import pytest
import yaml

from activities.catalog import load_contracts
from activities.contracts.targets import VaultSecretRef
from lab.hashistack.local import VaultDev
from runtime.readiness import ReadinessSettings, plan_checks
from runtime.readiness import plan as plan_module
from runtime.readiness.endpoints import secret_verdict
from runtime.readiness.model import ready
from runtime.readiness.vault_login import WorkerVaultLogin, worker_vault_token
from workflows.loader import plan_run

REPO = Path(__file__).resolve().parents[2]


def _approle(vault: VaultDev, tmp_path: Path) -> dict[str, str]:
    """An AppRole that may read the test secret, its credentials in files as an inventory names them."""
    admin = hvac.Client(url=vault.url, token=vault.token)
    admin.sys.create_or_update_policy("dns-reader", 'path "secret/data/coldstart/dns" { capabilities = ["read"] }')
    admin.auth.approle.create_or_update_approle("dns-reader", token_policies=["dns-reader"])
    (tmp_path / "role").write_text(admin.auth.approle.read_role_id("dns-reader")["data"]["role_id"])
    (tmp_path / "secret").write_text(admin.auth.approle.generate_secret_id("dns-reader")["data"]["secret_id"])
    return {"address": vault.url, "approle_role_id_file": str(tmp_path / "role"),
            "approle_secret_id_file": str(tmp_path / "secret")}


async def test_the_approle_token_reaches_the_checks_and_never_the_environment(
        vault: VaultDev, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VAULT_TOKEN", raising=False)
    target = {"name": "t", "telemetry": {"prometheus": "http://127.0.0.1:9"}, "vault": _approle(vault, tmp_path)}
    ref = VaultSecretRef(address=vault.url, path="coldstart/dns", field="tsig")
    async with worker_vault_token(target) as login:
        assert login.source == "the target's AppRole" and login.token
        # Another target's activity running in this process meanwhile sees no token of this one's.
        assert "VAULT_TOKEN" not in os.environ
        verdict = await secret_verdict(ref, token=login.token_for(ref))
        assert verdict.state == "ready", verdict.evidence
        token = login.token
    assert "VAULT_TOKEN" not in os.environ
    assert not hvac.Client(url=vault.url, token=token).is_authenticated()  # revoked on exit
    # Without the login, the same reference reads $VAULT_TOKEN, which is not set.
    unread = await secret_verdict(ref)
    assert unread.state == "not_ready" and "no Vault token in $VAULT_TOKEN" in unread.evidence
    # A reference that names its own token source keeps it.
    assert login.token_for(ref.model_copy(update={"token_env": "OTHER_TOKEN"})) is None
    assert login.token_for(ref.model_copy(update={"token_file": str(tmp_path / "t")})) is None
    assert WorkerVaultLogin("$VAULT_TOKEN").token_for(ref) is None


async def test_a_worker_token_in_the_environment_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAULT_TOKEN", "the-workers-own")
    async with worker_vault_token({"name": "t", "telemetry": {"prometheus": "http://127.0.0.1:9"},
                                   "vault": {"address": "http://127.0.0.1:9", "approle_role_id_file": "/nonexistent",
                                             "approle_secret_id_file": "/nonexistent"}}) as login:
        assert (login.source, login.token) == ("$VAULT_TOKEN", None)
    assert os.environ["VAULT_TOKEN"] == "the-workers-own"


async def test_every_check_that_reads_vault_is_handed_the_login(monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = yaml.safe_load((REPO / "runbooks/cases/consul-cold-start.yaml").read_text())["target"]
    inventory["nomad"]["token"] = {"address": "http://vault.test:8200", "path": "coldstart/nomad", "field": "token"}
    run = plan_run(REPO / "runbooks/consul-cold-start.yaml", registry=load_contracts(), inventory=inventory,
                   placeholders=True)
    handed: dict[str, str | None] = {}

    async def tsig(steering, *, timeout, token=None):
        handed["tsig"] = token
        return ready("signed")

    async def capacity(target, job, *, namespace, spec, vault_token=None):
        handed["capacity"] = vault_token
        return ready("fits")

    monkeypatch.setattr(plan_module, "tsig_verdict", tsig)
    monkeypatch.setattr(plan_module, "capacity_verdict", capacity)

    async def never():
        raise AssertionError("no Temporal here")

    settings = ReadinessSettings(connect=never, frontend="temporal.test:7233", task_queue="q", build_id="actions-x",
                                 vault=WorkerVaultLogin("the target's AppRole", "approle-token"))
    checks = {c.name: c for c in plan_checks(run, settings)}
    await checks["tsig:coldstart-steer."].probe()
    await checks["nomad.capacity:cache"].probe()
    assert handed == {"tsig": "approle-token", "capacity": "approle-token"}
