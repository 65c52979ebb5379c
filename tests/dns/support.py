"""Helpers shared by the DNS steering tests: inputs and a fake Vault client."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import dns.asyncquery
import dns.tsig
import dns.update

from activities.contracts.dns import SteerSetInput, parse_server
from activities.secrets import VaultSecretRef
from lab.dns import PdnsLab

__all__ = ["FQDN", "GAME_IP", "MAINT_IP", "FakeVault", "raw_update", "secret_ref", "set_input"]

GAME_IP = "10.20.0.10"
MAINT_IP = "10.20.0.99"
FQDN = "play.play.coldstart.lab."


class FakeVault:
    """Stands in for hvac.Client: serves one secret and records what it was asked."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.calls: list[dict[str, Any]] = []
        self.secrets = SimpleNamespace(kv=SimpleNamespace(v2=SimpleNamespace(read_secret_version=self._read)))

    def _read(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {"data": {"data": {"secret": self.secret}, "metadata": {"version": 1}}}

    def factory(self, url: str, token: str, verify: Any) -> FakeVault:
        self.calls.append({"url": url, "token": token})
        return self


def secret_ref() -> VaultSecretRef:
    return VaultSecretRef(address="http://vault.lab:8200", mount="secret", path="coldstart/dns-tsig", field="secret")


def set_input(lab: PdnsLab, percent: int, **overrides: Any) -> SteerSetInput:
    fields: dict[str, Any] = {
        "zone": lab.settings.zone,
        "name": "play",
        "servers": [lab.settings.address],
        "game_ip": GAME_IP,
        "maint_ip": MAINT_IP,
        "percent": percent,
        "ttl": lab.settings.record_ttl,
        "tsig_key_name": lab.settings.key_name,
        "tsig_secret": secret_ref(),
    }
    fields.update(overrides)
    return SteerSetInput(**fields)


async def raw_update(lab: PdnsLab, name: str, rdata: object, key: dns.tsig.Key | None) -> int:
    """Replace the LUA rrset at `name` bypassing the activity; returns the rcode (NOERROR even if refused)."""
    host, port = parse_server(lab.settings.address)
    upd = dns.update.UpdateMessage(
        lab.settings.zone, keyring=key, keyname=key.name if key else None, keyalgorithm=dns.tsig.HMAC_SHA256
    )
    upd.delete(name, "TYPE65402")
    upd.add(name, 30, rdata)
    reply = await dns.asyncquery.tcp(upd, host, port=port, timeout=3)
    return reply.rcode()
