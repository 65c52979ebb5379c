"""Failure drills through Temporal: secrets never reach the history; a wrong TSIG key fails the DNS step cleanly."""

from __future__ import annotations

import json

import hvac
import pytest
from temporalio.client import WorkflowFailureError

from lab.hashistack.local import VaultDev
from tests import support
from tests.dns.conftest import pdns_lab  # noqa: F401 - a real pdns_server fixture
from tests.dns.support import GAME_IP, MAINT_IP

ROOT_TOKEN = "root-token"


@pytest.fixture
def vault_with_secrets(pdns_lab, tmp_path):  # noqa: F811
    vault = VaultDev(tmp_path / "vault", ROOT_TOKEN).start()
    client = hvac.Client(url=vault.url, token=ROOT_TOKEN)
    client.secrets.kv.v2.create_or_update_secret(path="coldstart/dns-tsig", secret={"secret": pdns_lab.key.secret})
    client.secrets.kv.v2.create_or_update_secret(path="coldstart/dns-wrong", secret={"secret": "d3Jvbmcgc2VjcmV0IGtleSB2YWx1ZQ=="})
    token_file = tmp_path / "vault-token"
    token_file.write_text(ROOT_TOKEN + "\n")
    yield vault, str(token_file)
    vault.stop()


def _book(tmp_path, pdns_lab, vault_url, token_file, secret_path, name):  # noqa: F811
    settings = pdns_lab.settings
    return support.write_runbook(tmp_path, f"""
        metadata: {{name: {name}}}
        target: t
        params:
          percent: {{type: integer, default: 30}}
        steps:
          - id: vault-ok
            action: vault.read
            with: {{address: "{vault_url}", path: coldstart/dns-tsig, require_keys: [secret], token_file: "{token_file}"}}
          - id: steer
            action: dns.steer.set
            with:
              zone: "{settings.zone}"
              name: play
              servers: ["127.0.0.1:{settings.port}"]
              game_ip: "{GAME_IP}"
              maint_ip: "{MAINT_IP}"
              percent: ${{{{ params.percent }}}}
              tsig_key_name: "{pdns_lab.key.name}"
              tsig_secret: {{address: "{vault_url}", path: {secret_path}, field: secret, token_file: "{token_file}"}}
    """, name=name)


def _readable(history_json: str) -> str:
    """The history with every payload decoded: payload data is base64 in the JSON, so search both."""
    import base64

    decoded: list[str] = [history_json]

    def walk(node):
        if isinstance(node, dict):
            if "data" in node and "metadata" in node and isinstance(node["data"], str):
                decoded.append(base64.b64decode(node["data"]).decode("utf-8", "replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(history_json))
    return "\n".join(decoded)


async def test_history_holds_no_secret_of_a_step_that_reads_one(env, task_queue, tmp_path):
    """The secret check alone, with no DNS server: a step reads a Vault secret and a later step takes it as a
    reference; neither the value nor the Vault token is in any payload of the history."""
    vault = VaultDev(tmp_path / "vault", ROOT_TOKEN).start()
    try:
        secret = "c2VjcmV0LXRoYXQtbXVzdC1ub3QtbGVhaw=="
        hvac.Client(url=vault.url, token=ROOT_TOKEN).secrets.kv.v2.create_or_update_secret(
            path="coldstart/app", secret={"secret": secret})
        token_file = tmp_path / "vault-token"
        token_file.write_text(ROOT_TOKEN + "\n")
        book = support.write_runbook(tmp_path, f"""
            metadata: {{name: secret-read}}
            target: t
            steps:
              - id: read
                action: vault.read
                with: {{address: "{vault.url}", path: coldstart/app, require_keys: [secret], token_file: "{token_file}"}}
        """, name="secret-read")
        async with support.worker(env.client, task_queue):
            handle = await support.start(env.client, book, task_queue)
            await handle.result()
            history = _readable((await handle.fetch_history()).to_json())
    finally:
        vault.stop()
    assert "coldstart/app" in history  # the reference is there (decoded payloads are searched)
    for value in (secret, ROOT_TOKEN):
        assert value not in history, "a secret reached the workflow history"


async def _percent(pdns_lab):  # noqa: F811
    from activities.contracts.dns import SteerGetInput
    from activities.dns.actions import steer_get

    state = await steer_get(SteerGetInput(zone=pdns_lab.settings.zone, name="play",
                                          servers=[f"127.0.0.1:{pdns_lab.settings.port}"]))
    return state.servers[0].percent


async def test_history_holds_no_secret_and_wrong_key_changes_nothing(env, task_queue, tmp_path, pdns_lab, vault_with_secrets):  # noqa: F811
    vault, token_file = vault_with_secrets
    async with support.worker(env.client, task_queue):
        good = _book(tmp_path, pdns_lab, vault.url, token_file, "coldstart/dns-tsig", "steer-ok")
        handle = await support.start(env.client, good, task_queue, target={"name": "secrets-" + task_queue})
        await handle.result()
        assert await _percent(pdns_lab) == 30
        history = _readable((await handle.fetch_history()).to_json())
        for secret in (pdns_lab.key.secret, ROOT_TOKEN):
            assert secret not in history, "a secret reached the workflow history"
        # The references are there (decoded payloads), the values are not.
        assert "tsig_key_name" in history and pdns_lab.key.name in history and "coldstart/dns-tsig" in history

        wrong = _book(tmp_path, pdns_lab, vault.url, token_file, "coldstart/dns-wrong", "steer-wrong")
        handle = await support.start(env.client, wrong, task_queue, target={"name": "wrong-" + task_queue},
                                     params={"percent": 60})
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        message = str(failure.value.cause)
        assert "refused" in message or "TSIG" in message or "BADSIG" in message.upper(), message
        assert await _percent(pdns_lab) == 30, "a refused update must leave the percentage unchanged"
        history = _readable((await handle.fetch_history()).to_json())
        assert "d3Jvbmcgc2VjcmV0IGtleSB2YWx1ZQ==" not in history and ROOT_TOKEN not in history
