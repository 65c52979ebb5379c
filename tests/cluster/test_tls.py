"""Mutual TLS between the worker, the CLI and the frontend, all configured by one temporalio.envconfig profile."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from activities.journal import check_journal, read_journal
from lab.drills.harness import WorkerProcess
from runtime.cluster import Cluster, FrontendTLS
from runtime.connection import connect
from tests import support
from tests.cluster.certs import Authority

SERVER_NAME = "temporal.coldstart.test"
PROFILE = "secure"


@pytest.fixture(scope="module")
async def secure(tmp_path_factory, cluster_bin):
    """A cluster whose frontend requires client certs, and an envconfig file with a profile for it."""
    root = tmp_path_factory.mktemp("tls")
    ca = Authority(root / "pki")
    server_cert, server_key = ca.issue("frontend", dns=[SERVER_NAME], ips=["127.0.0.1"], server=True)
    system_cert, system_key = ca.issue("cluster-admin")
    tls = FrontendTLS(ca=ca.path, server_cert=server_cert, server_key=server_key,
                      client_cert=system_cert, client_key=system_key, server_name=SERVER_NAME)
    async with Cluster(root / "cluster", bin_dir=cluster_bin, tls=tls) as cluster:
        cert, key = ca.issue("coldstart-worker")
        config = root / "temporal.toml"
        config.write_text(f"""
[profile.{PROFILE}]
address = "{cluster.address}"
namespace = "default"

[profile.{PROFILE}.tls]
server_ca_cert_path = "{ca.path}"
client_cert_path = "{cert}"
client_key_path = "{key}"
server_name = "{SERVER_NAME}"
""")
        yield cluster, config, ca


async def test_worker_and_cli_run_a_runbook_over_mutual_tls_from_a_profile(secure, task_queue, tmp_path, monkeypatch):
    cluster, config, _ = secure
    profile_env = {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": PROFILE}
    for name, value in profile_env.items():
        monkeypatch.setenv(name, value)
    client = await connect(profile=PROFILE)
    assert client.service_client.config.tls, "the profile's TLS settings were not used"

    notes = tmp_path / "notes.jsonl"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: over-tls}}
        target: t
        steps:
          - id: hello
            action: core.note
            with: {{message: "over mutual TLS", journal: "{notes}"}}
          - id: pause
            wait: 1s
          - id: bye
            action: core.note
            with: {{message: "done", journal: "{notes}"}}
    """)
    # The real worker entry point (worker.py): its TLS settings come from the profile alone, and its catalog
    # (a development target here, so it runs this test's own runbook) from its environment.
    targets = tmp_path / "targets"
    inventory = support.development_target(targets, "tls-" + task_queue)
    journal = tmp_path / "actions.jsonl"
    worker = WorkerProcess(cluster.address, task_queue, journal, tmp_path / "worker.log",
                           {**profile_env, "COLDSTART_TARGETS": str(targets)}, allow_development=True)
    worker.start()
    try:
        handle = await support.start(client, book, task_queue, target=inventory)
        await handle.result()
        # The coldstart CLI reads the same profile from the environment (its status query needs the worker).
        shown = await asyncio.to_thread(
            subprocess.run, [str(Path(sys.prefix) / "bin" / "coldstart"), "status", handle.id, "--json"],
            env={**os.environ, **profile_env}, capture_output=True, text=True, timeout=60)
    finally:
        worker.stop()
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "succeeded"
    assert [json.loads(line)["message"] for line in support.lines(notes)] == ["over mutual TLS", "done"]
    check = check_journal(read_journal(journal))
    assert len(check.attempts) == 2 and check.repeated == [], check.summary()


async def _answers(address: str, tls: TLSConfig) -> bool:
    """A client with `tls` connects and the frontend answers a health check."""
    client = await connect(target_host=address, namespace="default", tls=tls)
    return await client.service_client.check_health()


async def test_a_client_without_a_client_cert_is_refused(secure):
    cluster, _, ca = secure
    # The positive control, before the refusals and after them: a certificate from the cluster's CA connects, so
    # each refusal between is the server refusing that client, not a server that is down.
    cert, key = ca.issue("operator")
    member = TLSConfig(server_root_ca_cert=ca.path.read_bytes(), client_cert=cert.read_bytes(),
                       client_private_key=key.read_bytes(), domain=SERVER_NAME)
    assert await _answers(cluster.address, member)
    no_cert = TLSConfig(server_root_ca_cert=ca.path.read_bytes(), domain=SERVER_NAME)
    # The server trusted by the client (its CA given) demands a client certificate. How the refusal reads
    # depends on whether the client's first request races the server's TLS alert (TLS 1.3): the alert
    # ("CertificateRequired"), a closed connection or a broken pipe; the connection is refused either way.
    with pytest.raises(RuntimeError, match="^Failed client connect: "):
        await connect(target_host=cluster.address, namespace="default", tls=no_cert)
    # Plain text to the TLS port: refused (this says nothing about client certificates, only no plaintext).
    with pytest.raises(RuntimeError, match="^Failed client connect"):
        await connect(target_host=cluster.address, namespace="default", tls=False)
    # A cert from another CA is refused too.
    stranger = Authority(ca.directory.parent / "stranger")
    cert, key = stranger.issue("intruder")
    foreign = TLSConfig(server_root_ca_cert=ca.path.read_bytes(), client_cert=cert.read_bytes(),
                        client_private_key=key.read_bytes(), domain=SERVER_NAME)
    # The server refuses a certificate from a CA it does not know (its "UnknownCA" alert, or the connection
    # closed on it, as above).
    with pytest.raises(RuntimeError, match="^Failed client connect: "):
        await connect(target_host=cluster.address, namespace="default", tls=foreign)
    assert await _answers(cluster.address, member)
