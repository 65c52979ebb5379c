"""Imports every action's contract (for validating and documenting runbooks) or its implementation too (for a worker)."""

from __future__ import annotations

import importlib

from activities.registry import Registry, default_registry

__all__ = ["ACTION_MODULES", "CONTRACT_MODULES", "load_contracts", "load_registry"]

# What a runbook may call: models, defaults and reference text only, so `validate` and `actions`
# never import Temporal's SDK or the Consul, Nomad, Vault and SSH clients the implementations need.
CONTRACT_MODULES = [
    "activities.contracts.core",
    "activities.contracts.telemetry",
    "activities.contracts.firewall",
    "activities.contracts.dns",
    "activities.contracts.consul_snapshots",
    "activities.contracts.consul_leadership",
    "activities.contracts.consul_kv",
    "activities.contracts.consul_agents",
    "activities.contracts.consul_users",
    "activities.contracts.nomad",
    "activities.contracts.vault",
    "activities.contracts.containers",
    "activities.contracts.sessions",
]

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
]


def load_contracts() -> Registry:
    """Every action's contract; a spec's `fn` is set only where its implementation was imported too."""
    for module in CONTRACT_MODULES:
        importlib.import_module(module)
    return default_registry


def load_registry() -> Registry:
    """Every action with its implementation bound, as a worker runs them."""
    load_contracts()
    for module in ACTION_MODULES:
        importlib.import_module(module)
    return default_registry
