"""The action tests' platform, once per backend: the stand-ins, and real Consul (3 servers), Nomad and Vault/OpenBao.

The real backend is the reference: every test runs on both unless it says why it cannot. It is
skipped, with the reason, only when a real binary is missing from PATH.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import consul
import hvac
import nomad
import pytest

from activities._clients import ConsulTarget, NomadTarget
from activities.secrets import VaultSecretRef
from lab.hashistack.local import LocalStack, VaultDev, missing_binaries
from lab.standins.clock import FakeClock
from lab.standins.consul_load import LoadParams
from tests.real import unavailable
from tests.standins.conftest import ConsulLab, NomadLab, start_consul, start_nomad, wait_until

CONSUL_TOKEN = "consul-acl-Zq81xT0ken"
VAULT_ROOT = "root-token"
BACKENDS = ("standin", "real")


@dataclass
class Stack:
    backend: str
    consul_urls: list[str]
    nomad_url: str
    vault_url: str
    token_file: str
    # Stand-in internals (fault hooks, fake clocks) when backend == "standin"; None on real agents.
    consul: ConsulLab | None = None
    nomad: NomadLab | None = None
    local: LocalStack | None = None
    # Vault has no stand-in: a real dev server (Vault or OpenBao) on both backends.
    vault: VaultDev | None = None

    @property
    def vault_log(self):
        return self.vault.log if self.vault is not None else self.local.root / "vault.log"

    @property
    def real(self) -> bool:
        return self.backend == "real"

    def standin_only(self, why: str) -> None:
        """For the few checks that need a stand-in hook (a fake clock, a scripted fault)."""
        if self.real:
            pytest.skip(f"stand-in only: {why}")

    def token_ref(self, path: str = "coldstart/consul") -> VaultSecretRef:
        return VaultSecretRef(address=self.vault_url, path=path, field="token", token_file=self.token_file)

    def consul_target(self, **kw) -> ConsulTarget:
        return ConsulTarget(address=self.consul_urls[0], token=self.token_ref(), servers=list(self.consul_urls), **kw)

    def nomad_target(self) -> NomadTarget:
        return NomadTarget(address=self.nomad_url)

    def admin(self, index: int = 0) -> consul.Consul:
        """A py-consul client with the management token, for arranging and asserting (not under test)."""
        url = urlsplit(self.consul_urls[index])
        return consul.Consul(url.hostname, url.port, token=CONSUL_TOKEN)

    def check_registration(self, check_id: str, index: int = 0) -> dict[str, Any]:
        """How agent `index` has check `check_id` registered: Consul's CheckType (HTTP target, Method, Header,
        Body, TCP address, Interval and Timeout in nanoseconds, ...), read from the agent, not from an action.

        No HTTP endpoint returns it (HealthCheck.Definition stays empty for agent-registered checks), so it is
        read where the agent itself keeps it: a real agent persists every check registered over its API in its
        data dir as checks/<sha256 of the check ID>, {"Check", "ChkType", "Token", "Source"}, rewritten at each
        registration before the API answers; the stand-in keeps the same CheckType in its model.
        """
        if self.real:
            path = self.local.consuls[index].data_dir / "checks" / hashlib.sha256(check_id.encode()).hexdigest()
            return json.loads(path.read_text())["ChkType"]  # the file's Token stays in it
        node = list(self.consul.ports)[index]
        return copy.deepcopy(self.consul.cluster.checks[node][check_id]["ChkType"])

    def nomad_api(self) -> nomad.Nomad:
        url = urlsplit(self.nomad_url)
        return nomad.Nomad(host=url.hostname, port=url.port, timeout=10)

    def wait_until(self, predicate, timeout: float = 20.0, step: float = 0.1):
        return wait_until(predicate, timeout, step)


def _standin_stack(tmp) -> Stack:
    vault = VaultDev(tmp / "vault", VAULT_ROOT).start()
    consul_lab = start_consul(FakeClock(), LoadParams(rate_window_s=1.0), acl_token=CONSUL_TOKEN)
    # Nomad's clock starts at the real time: "failed in the last N minutes" compares with wall time.
    nomad_lab = start_nomad(FakeClock(start=time.time()), tmp / "nomad")
    return Stack("standin", [f"http://127.0.0.1:{p}" for p in consul_lab.ports.values()], nomad_lab.url, vault.url,
                 "", consul=consul_lab, nomad=nomad_lab, vault=vault)


def _real_stack(tmp) -> Stack:
    local = LocalStack(tmp / "hashistack", consul_token=CONSUL_TOKEN, vault_token=VAULT_ROOT, consul_servers=3)
    local.__enter__()
    return Stack("real", local.consul_urls, local.nomad_url, local.vault_url, "", local=local)


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request, tmp_path_factory):
    if request.param == "real" and (missing := missing_binaries()):
        unavailable(f"real backend: no {', '.join(missing)} binary on PATH "
                    "(CI unpacks ../shared/hashistack; see README)")
    tmp = tmp_path_factory.mktemp(f"stack-{request.param}")
    built = _standin_stack(tmp) if request.param == "standin" else _real_stack(tmp)
    token_file = tmp / "vault-token"
    token_file.write_text(VAULT_ROOT + "\n")
    built.token_file = str(token_file)
    try:
        hvac.Client(url=built.vault_url, token=VAULT_ROOT).secrets.kv.v2.create_or_update_secret(
            path="coldstart/consul", secret={"token": CONSUL_TOKEN})
        yield built
    finally:
        if built.local is not None:
            built.local.stop()
        for lab in (built.nomad, built.consul):
            if lab is not None:
                lab.server.stop()
        if built.vault is not None:
            built.vault.stop()
