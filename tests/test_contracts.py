"""Action contracts stand apart from their implementations: `validate`, `plan` and `actions` read the contracts
without Temporal's SDK or the clients the actions drive, and a worker binds an implementation to every contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from activities.binding import implements
from activities.registry import Registry, Unimplemented, declare

REPO = Path(__file__).resolve().parents[1]

# What the implementations import and a runbook's check never needs.
IMPLEMENTATION_ONLY = ("temporalio", "asyncssh", "consul", "nomad", "hvac", "httpx", "requests", "asyncio")

_PROBE = """
import json, sys
forbidden, sys.argv = set(json.loads(sys.argv[1])), ["coldstart", *json.loads(sys.argv[2])]
from cli import main
code = main._run()
print(json.dumps({"code": code, "loaded": sorted({name.split(".")[0] for name in sys.modules} & forbidden)}))
"""


def _imports_of(*argv: str) -> dict:
    # The command as a user's shell runs it: no setting another test of this process left in the environment.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("COLDSTART_", "TEMPORAL_"))}
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(IMPLEMENTATION_ONLY), json.dumps(argv)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env=environ)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return found if found["code"] == 0 else {**found, "stderr": done.stderr[-2000:]}


@pytest.mark.parametrize("argv", [("validate", "runbooks/demo.yaml"), ("--help",), ("--version",),
                                  ("actions", "consul.snapshot.restore")])
def test_checking_a_runbook_loads_no_sdk_nor_client(argv: tuple[str, ...]) -> None:
    assert _imports_of(*argv) == {"code": 0, "loaded": []}


def test_a_plan_loads_no_sdk_nor_client() -> None:
    # The views' module holds asyncio for the live view's sleep; Temporal's client waits for `run --follow`.
    assert _imports_of("plan", "runbooks/demo.yaml") == {"code": 0, "loaded": ["asyncio"]}


_CATALOG = """
import json
from activities.catalog import load_contracts, load_registry
contracts = load_contracts()
print(json.dumps({"declared": contracts.names(), "bound": [n for n, s in contracts.specs.items() if s.fn]}))
print(json.dumps({"implemented": load_registry().names()}))
"""


def test_every_contract_has_an_implementation_and_every_implementation_a_contract() -> None:
    done = subprocess.run([sys.executable, "-c", _CATALOG], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    contracts, registry = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert contracts["bound"] == [] and len(contracts["declared"]) >= 30
    # An action implemented outside the contract modules would be refused by `validate` yet run by a worker.
    assert registry["implemented"] == contracts["declared"]


_NAMESPACE = """
import importlib, json, sys
from activities.catalog import CONTRACTS
for module in CONTRACTS[sys.argv[1]]:
    importlib.import_module(module)
from activities.registry import default_registry
print(json.dumps(sorted(default_registry.specs)))
"""


def test_a_namespace_s_contract_modules_declare_every_action_of_it() -> None:
    """`validate` imports only the contracts of the namespaces a runbook calls: each namespace's modules must
    declare all of its actions (a namespace missing from CONTRACTS falls back to importing every module)."""
    from activities.catalog import CONTRACTS, load_contracts

    every = load_contracts().names()
    assert sorted(CONTRACTS) == sorted({name.split(".")[0] for name in every})
    for namespace in CONTRACTS:
        done = subprocess.run([sys.executable, "-c", _NAMESPACE, namespace], cwd=REPO, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        declared = json.loads(done.stdout.strip().splitlines()[-1])
        assert [n for n in every if n.split(".")[0] == namespace and n not in declared] == [], namespace


def test_asking_for_one_action_imports_only_its_namespace() -> None:
    probe = ("import sys\nfrom activities.catalog import load_contracts\n"
             "assert load_contracts().get('core.wait') is not None\n"
             "print(sorted(m for m in sys.modules if m.startswith('activities.contracts.') and m.count('.') == 2))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['activities.contracts.core', 'activities.contracts.model']"


class _In(BaseModel):
    name: str


class _Out(BaseModel):
    text: str


class _Other(BaseModel):
    text: str


def test_an_implementation_must_take_and_return_its_contract_s_models() -> None:
    registry = Registry()
    contract = declare("test.echo", _In, _Out, doc="Echo the name.", registry=registry)
    with pytest.raises(TypeError, match=r"test.echo: the implementation takes _In -> _Other, the contract says "
                                        r"_In -> _Out"):
        @implements(contract, registry=registry)
        def echo(inp: _In) -> _Other:
            return _Other(text=inp.name)
    assert registry.get("test.echo") == contract


def test_a_worker_refuses_a_contract_nobody_implemented() -> None:
    registry = Registry()
    declare("test.echo", _In, _Out, doc="Echo the name.", registry=registry)
    declare("test.shout", _In, _Out, doc="Shout the name.", registry=registry)

    @implements(registry.specs["test.echo"], registry=registry)
    def echo(inp: _In) -> _Out:
        return _Out(text=inp.name)

    with pytest.raises(Unimplemented, match=r"^actions declared without an implementation: test.shout$"):
        registry.activities()
    assert registry.get("test.shout").fn is None and registry.get("test.echo").fn is not None


def test_a_name_declared_twice_differently_is_refused() -> None:
    registry = Registry()
    declare("test.echo", _In, _Out, doc="Echo the name.", registry=registry)
    declare("test.echo", _In, _Out, doc="Echo the name.", registry=registry)
    with pytest.raises(ValueError, match="declared twice, differently"):
        declare("test.echo", _In, _Other, doc="Echo the name.", registry=registry)
