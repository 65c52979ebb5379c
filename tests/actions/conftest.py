"""Stand-ins for the action tests: an ACL-protected Consul, Nomad and the Vault holding the Consul token."""

from __future__ import annotations

import time
from dataclasses import dataclass

import hvac
import pytest

from lab.standins.clock import FakeClock
from lab.standins.consul_load import LoadParams
from tests.standins.conftest import ConsulLab, NomadLab, VaultLab, start_consul, start_nomad, start_vault

from activities._clients import ConsulTarget, NomadTarget
from activities.secrets import VaultSecretRef

CONSUL_TOKEN = "consul-acl-Zq81xT0ken"


@dataclass
class Stack:
    consul: ConsulLab
    nomad: NomadLab
    vault: VaultLab
    token_file: str

    def token_ref(self, path: str = "coldstart/consul") -> VaultSecretRef:
        return VaultSecretRef(address=self.vault.url, path=path, field="token", token_file=self.token_file)

    def consul_target(self, **kw) -> ConsulTarget:
        ports = self.consul.ports
        return ConsulTarget(address=f"http://127.0.0.1:{ports['consul1']}", token=self.token_ref(),
                            servers=[f"http://127.0.0.1:{p}" for p in ports.values()], **kw)

    def nomad_target(self) -> NomadTarget:
        return NomadTarget(address=self.nomad.url)

    def admin(self):
        """A py-consul client with the token, for arranging and asserting (not under test)."""
        return self.consul.client("consul1", token=CONSUL_TOKEN)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    vault = start_vault()
    token_file = tmp / "vault-token"
    token_file.write_text("root-token\n")
    hvac.Client(url=vault.url, token="root-token").secrets.kv.v2.create_or_update_secret(
        path="coldstart/consul", secret={"token": CONSUL_TOKEN})
    consul = start_consul(FakeClock(), LoadParams(rate_window_s=1.0), acl_token=CONSUL_TOKEN)
    # Nomad's clock starts at the real time: "failed in the last N minutes" compares with wall time.
    nomad = start_nomad(FakeClock(start=time.time()), tmp / "nomad")
    yield Stack(consul, nomad, vault, str(token_file))
    for server in (nomad.server, consul.server, vault.server):
        server.stop()
