"""Action modules and helper modules: importing a helper binds no action; the catalog still has every action."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from activities.catalog import ACTION_MODULES, load_registry

ROOT = Path(__file__).resolve().parents[1]

# Modules without @action (codecs, parsers, readers, models) and the packages around them.
PURE_MODULES = [
    "activities.consul",
    "activities.consul._kv",
    "activities.consul.agent_hosts",
    "activities.consul.archive",
    "activities.consul.services",
    "activities.dns",
    "activities.dns.axfr",
    "activities.dns.ecs",
    "activities.dns.steering",
    "activities.firewall",
    "activities.firewall.rules",
]

EXPECTED_ACTIONS = [
    "cache.warm",
    "containers.kill_inits",
    "containers.list",
    "consul.agents.streaming",
    "consul.agents.streaming_restore",
    "consul.agents.streaming_status",
    "consul.health",
    "consul.kv.delete_prefix",
    "consul.kv.restore",
    "consul.kv.set",
    "consul.leader.transfer",
    "consul.snapshot.preview",
    "consul.snapshot.restore",
    "consul.snapshot.save",
    "consul.snapshot.select",
    "consul.user.disable",
    "consul.user.enable",
    "consul.users.disable",
    "consul.users.enable",
    "core.http_check",
    "core.note",
    "core.prometheus_query",
    "core.wait",
    "dns.steer.get",
    "dns.steer.sample",
    "dns.steer.set",
    "firewall.allow",
    "firewall.block",
    "firewall.revoke",
    "firewall.status",
    "firewall.unblock",
    "nomad.job.redeploy_from_scratch",
    "nomad.jobs.scale",
    "nomad.nodes.quarantine_unhealthy",
    "nomad.nodes.restore_eligibility",
    "sessions.cordon",
    "sessions.release",
    "telemetry.read",
    "vault.health",
    "vault.identity_keys",
    "vault.read",
]

_CHECK = """
import importlib, sys
importlib.import_module({module!r})
from activities.registry import default_registry
bound = [name for name, spec in default_registry.specs.items() if spec.fn is not None]
assert bound == [], bound
from activities.catalog import ACTION_MODULES
loaded = [m for m in ACTION_MODULES if m in sys.modules]
assert loaded == [], loaded
"""


@pytest.mark.parametrize("module", PURE_MODULES)
def test_importing_a_helper_module_binds_no_action(module: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _CHECK.format(module=module)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def test_helper_modules_are_not_action_modules() -> None:
    assert not set(PURE_MODULES) & set(ACTION_MODULES)


def test_registry_still_has_every_action() -> None:
    names = load_registry().names()
    assert [n for n in EXPECTED_ACTIONS if n not in names] == []
    split = ("consul.", "dns.", "firewall.")
    assert [n for n in names if n.startswith(split)] == [n for n in EXPECTED_ACTIONS if n.startswith(split)]
