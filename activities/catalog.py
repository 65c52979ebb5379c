"""Imports every action module so the default registry is complete."""

from __future__ import annotations

import importlib

from activities.registry import Registry, default_registry

__all__ = ["ACTION_MODULES", "load_registry"]

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


def load_registry() -> Registry:
    for module in ACTION_MODULES:
        importlib.import_module(module)
    return default_registry
