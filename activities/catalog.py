"""Imports every action's contract (for validating and documenting runbooks) or its implementation too (for a worker)."""

from __future__ import annotations

import importlib

from activities.registry import Registry, default_registry

__all__ = ["ACTION_MODULES", "CONTRACTS", "CONTRACT_MODULES", "load_contracts", "load_registry"]

# What a runbook may call, by namespace (an action name's first part): models, defaults and reference text
# only, so `validate` and `actions` never import Temporal's SDK or the Consul, Nomad, Vault and SSH clients
# the implementations need, and `validate` imports only the namespaces a runbook calls.
CONTRACTS = {
    "core": ["activities.contracts.core"],
    "telemetry": ["activities.contracts.telemetry"],
    "firewall": ["activities.contracts.firewall"],
    "dns": ["activities.contracts.dns"],
    "consul": [
        "activities.contracts.consul_snapshots",
        "activities.contracts.consul_leadership",
        "activities.contracts.consul_kv",
        "activities.contracts.consul_agents",
        "activities.contracts.consul_users",
    ],
    "nomad": ["activities.contracts.nomad"],
    "vault": ["activities.contracts.vault"],
    "containers": ["activities.contracts.containers"],
    "sessions": ["activities.contracts.sessions"],
    "cache": ["activities.contracts.cache"],
}
CONTRACT_MODULES = [module for modules in CONTRACTS.values() for module in modules]

ACTION_MODULES = [
    "activities.core",
    "activities.telemetry",
    "activities.firewall.actions",
    "activities.dns.actions",
    "activities.consul.snapshots",
    "activities.consul.leadership",
    "activities.consul.kv",
    "activities.consul.agents",
    "activities.consul.users",
    "activities.nomad",
    "activities.vault",
    "activities.containers",
    "activities.sessions",
    "activities.cache",
]


def _declare(name: str | None) -> None:
    """Import the contracts of `name`'s namespace; every contract for None or a namespace not listed."""
    namespace = name.split(".")[0] if name is not None else None
    for module in CONTRACTS.get(namespace or "", CONTRACT_MODULES):
        importlib.import_module(module)


def load_contracts() -> Registry:
    """Every action's contract, each namespace's imported when one of its actions is first asked for; a spec's
    `fn` is set only where its implementation was imported too."""
    default_registry.declaring = _declare
    return default_registry


def load_registry() -> Registry:
    """Every action with its implementation bound, as a worker runs them."""
    load_contracts()
    _declare(None)
    for module in ACTION_MODULES:
        importlib.import_module(module)
    return default_registry
