"""An https endpoint is checked with the CA its input names beside it, as the action would reach it."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from activities.catalog import load_contracts
from runtime.readiness import ReadinessSettings, plan_checks
from runtime.readiness.endpoints import endpoint_verdict
from tests.cluster.certs import Authority
from workflows.loader import plan_run


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An https listener on 127.0.0.1 with a certificate from a private CA; yields its URL and the CA's path."""
    ca = Authority(tmp_path / "ca")
    cert, key = ca.issue("endpoint", ips=["127.0.0.1"], server=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca.path
    finally:
        server.shutdown()
        server.server_close()


async def test_an_https_endpoint_is_reachable_with_its_ca_and_not_without(https: tuple[str, Path]) -> None:
    url, ca = https
    assert (await endpoint_verdict(url, ca_cert=str(ca))).state == "ready"
    untrusted = await endpoint_verdict(url)
    assert untrusted.state == "not_ready" and "CERTIFICATE_VERIFY_FAILED" in untrusted.evidence.upper()


async def _never():
    raise AssertionError("no Temporal in this test")


async def test_the_planned_endpoint_check_uses_the_ca_beside_the_address(https: tuple[str, Path], tmp_path: Path) -> None:
    url, ca = https
    runbook = tmp_path / "tls.yaml"
    runbook.write_text(f"""version: 1
metadata: {{name: tls}}
target: t
steps:
  - id: leader
    action: consul.health
    with: {{consul: {{address: "{url}", ca_cert: "{ca}"}}}}
""")
    planned = plan_run(runbook, registry=load_contracts(), inventory={"name": "t", "telemetry": {"prometheus": "http://127.0.0.1:9"}},
                       placeholders=True)
    settings = ReadinessSettings(connect=_never, frontend="temporal.test:7233", task_queue="q", build_id="actions-x")
    check = next(c for c in plan_checks(planned, settings) if c.name == f"endpoint:{url}")
    verdict = await check.probe()
    assert verdict.state == "ready", verdict.evidence
