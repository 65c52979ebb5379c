"""An install from the package's declared `dependencies` alone (no extras) runs the controller: the worker loads
every action, `coldstart actions` describes them and `coldstart validate` checks the bundled runbooks.

Each check runs in a Python whose imports of any distribution outside `dependencies` (and what those need)
fail as they would where it is not installed: the extras' packages (lab, report, infra, test, check) and
everything they alone bring, read from pyproject.toml and this environment's metadata."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# The installer's own, present in any virtual environment: not the project's dependencies.
INSTALLER = {"pip", "setuptools", "coldstart"}

_HOOK = """
import importlib.abc, sys
BLOCKED = frozenset({blocked!r})

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (only the extras install it)", name=name)
        return None

early = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
assert not early, f"imported before the hook: {{early}}"
sys.meta_path.insert(0, _NotInstalled())
"""


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@cache
def _base_closure() -> frozenset[str]:
    """The distributions `dependencies` installs here."""
    return dependency_closure(_project()["dependencies"])


def dependency_closure(requirements: Iterable[str]) -> frozenset[str]:
    """The distributions these requirements install here: each one, its extras, and theirs, by their markers
    (read from this environment's metadata, which tests/test_lock.py holds to requirements.lock)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(line) for line in requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for line in metadata.requires(req.name) or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": extra}) for extra in (req.extras or {""})):
                todo.append(sub)
    return frozenset(name for name, _ in seen)


def _extras_only() -> set[str]:
    """The distributions named in the optional dependencies and not in `dependencies`."""
    project = _project()
    named = {canonicalize_name(Requirement(line).name)
             for lines in project["optional-dependencies"].values() for line in lines}
    return named - {canonicalize_name(Requirement(line).name) for line in project["dependencies"]} - {"coldstart"}


@cache
def _blocked_modules() -> frozenset[str]:
    """Top-level modules of every installed distribution a base install lacks (a namespace such as `google`
    stays importable while a base dependency provides part of it)."""
    allowed = _base_closure() | INSTALLER
    return frozenset(
        module for module, dists in metadata.packages_distributions().items()
        if dists and not {canonicalize_name(d) for d in dists} & allowed
    )


def _run_without_extras(code: str) -> subprocess.CompletedProcess[str]:
    program = _HOOK.format(blocked=sorted(_blocked_modules())) + code
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_hook_blocks_the_extras() -> None:
    modules = _blocked_modules()
    for extra_only in ("pytest", "ruff", "pulumi", "matplotlib"):
        assert extra_only in modules
    proc = _run_without_extras("import pytest")
    assert proc.returncode != 0 and "No module named 'pytest' (only the extras install it)" in proc.stderr


def test_the_extras_add_only_what_dependencies_lacks() -> None:
    # A package the controller needs belongs in `dependencies`, not in an extra as well.
    base = {canonicalize_name(Requirement(line).name) for line in _project()["dependencies"]}
    assert not _extras_only() & base


def test_a_worker_loads_every_action_with_the_declared_dependencies_only() -> None:
    proc = _run_without_extras("""
import json
import worker, runtime.worker, triggers.receiver
from activities.catalog import load_registry
registry = load_registry()
print(json.dumps({name: registry.get(name).fn is not None for name in registry.names()}))
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    bound = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "cache.warm" in bound  # the cold-start runbook's warm-up (asyncpg, redis)
    assert [name for name, fn in bound.items() if not fn] == []


def _cli_without_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return _run_without_extras(f"""
import sys
from cli.main import _run
sys.argv = ["coldstart", *{list(args)!r}]
code = _run()
sys.stdout.flush()
sys.exit(code)
""")


def test_the_cli_describes_and_validates_with_the_declared_dependencies_only() -> None:
    described = _cli_without_extras("actions", "--json")
    assert described.returncode == 0, described.stderr[-3000:]
    assert "cache.warm" in {doc["name"] for doc in json.loads(described.stdout)}
    for runbook in sorted((ROOT / "runbooks").glob("*.yaml")):
        checked = _cli_without_extras("validate", str(runbook.relative_to(ROOT)))
        assert checked.returncode == 0, checked.stderr[-3000:]
