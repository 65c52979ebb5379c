"""The controller must not depend on what it restores: Temporal's addresses and secrets checked against the platform."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml

if TYPE_CHECKING:
    from activities.inventory import Inventory

__all__ = ["host_of", "resolver_violations", "restored_hosts", "violations"]


def host_of(address: str) -> str:
    """The host of a URL, host:port or bare host, lower case, without a trailing dot."""
    parsed = urlsplit(address if "://" in address else f"//{address}")
    return (parsed.hostname or address).lower().rstrip(".")


def _through_consul(host: str) -> bool:
    # Consul's DNS interface answers the .consul domain: a name there needs Consul up to resolve.
    return host == "consul" or host.endswith(".consul")


def _server_addresses(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, address) of everything the Temporal server dials: its stores, its frontend as
    clusters see it, the frontend its system worker calls."""
    found: list[tuple[str, str]] = []
    for name, store in ((config.get("persistence") or {}).get("datastores") or {}).items():
        where = f"persistence.datastores.{name}"
        if addr := (store.get("sql") or {}).get("connectAddr"):
            found.append((f"{where}.sql.connectAddr", str(addr)))
        for host in str((store.get("cassandra") or {}).get("hosts") or "").split(","):
            if host.strip():
                found.append((f"{where}.cassandra.hosts", host.strip()))
        if host := ((store.get("elasticsearch") or {}).get("url") or {}).get("host"):
            found.append((f"{where}.elasticsearch.url.host", str(host)))
    for name, info in ((config.get("clusterMetadata") or {}).get("clusterInformation") or {}).items():
        if addr := (info or {}).get("rpcAddress"):
            found.append((f"clusterMetadata.clusterInformation.{name}.rpcAddress", str(addr)))
    if addr := (config.get("publicClient") or {}).get("hostPort"):
        found.append(("publicClient.hostPort", str(addr)))
    return found


def restored_hosts(inventory: Inventory) -> dict[str, str]:
    """Host -> the restored system it belongs to (Consul, Nomad, Vault), from the inventory."""
    systems: dict[str, str] = {}
    endpoints = inventory.endpoints
    for system, urls in (("consul", endpoints.consul), ("nomad", endpoints.nomad), ("vault", endpoints.vault)):
        systems.update({host_of(url): system for url in urls})
    if inventory.consul:
        systems.update({host_of(url): "consul" for url in [inventory.consul.address, *inventory.consul.servers]})
    if inventory.nomad:
        systems[host_of(inventory.nomad.address)] = "nomad"
    if inventory.vault:
        systems[host_of(inventory.vault.address)] = "vault"
    for host in inventory.hosts_with_role("consul-server").values():
        systems[host_of(host.address)] = "consul"
    return systems


def violations(frontend: str, server_config: str, inventory: Inventory | None = None) -> list[str]:
    """Why this controller would depend on what it restores; empty when it does not.

    frontend: the address workers and the CLI dial; server_config: the Temporal server's config
    YAML as written; inventory: the platform the runbooks restore (its Consul, Nomad and Vault),
    whose gate telemetry must not go through Consul either.
    """
    problems: list[str] = []
    config = yaml.safe_load(server_config) or {}
    restored = restored_hosts(inventory) if inventory else {}
    dialled = [("Temporal frontend", frontend), *_server_addresses(config)]
    if inventory:
        dialled.append((f"inventory {inventory.name} telemetry.prometheus", inventory.telemetry.prometheus))
    for where, address in dialled:
        host = host_of(address)
        if _through_consul(host):
            problems.append(f"{where} is {address}: a Consul DNS name, so recovering Consul would need Consul")
        elif host in restored:
            problems.append(f"{where} is {address}: on {restored[host]}, which the runbooks restore")
    # Secrets the server reads (the DB password) come from a local file or the environment, never Vault.
    for number, line in enumerate(server_config.splitlines(), 1):
        if "vault" in line.lower():
            problems.append(f"server config line {number} refers to Vault: {line.strip()}")
    return problems


def resolver_violations(resolv_conf: str, inventory: Inventory | None = None) -> list[str]:
    """Why this host's name resolution (resolv.conf) would need what the runbooks restore: a nameserver that is
    a Consul server (its DNS interface) or another restored host; empty when it would not."""
    restored = restored_hosts(inventory) if inventory else {}
    problems = []
    for number, line in enumerate(resolv_conf.splitlines(), 1):
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver" and (host := host_of(fields[1])) in restored:
            problems.append(f"resolv.conf line {number}: nameserver {fields[1]} is on {restored[host]}, which the "
                            f"runbooks restore")
        elif len(fields) >= 2 and fields[0] in ("search", "domain") and any(_through_consul(d.rstrip(".")) for d in fields[1:]):
            problems.append(f"resolv.conf line {number}: {line.strip()}: short names resolve through Consul")
    return problems
