"""The controller never imports the lab: what runs against production needs nothing of the drill platform."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The lab's commands (`coldstart lab`, `coldstart drill NAME`) reach the CLI through entry points
# (pyproject.toml, coldstart.plugins), so no controller module is exempt.
def _controller_modules() -> list[Path]:
    found = [ROOT / "worker.py"]
    for package in ("activities", "workflows", "runtime", "infra", "cli", "triggers"):
        found += sorted((ROOT / package).rglob("*.py"))
    return found


def _imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_controller_module_imports_the_lab():
    modules = _controller_modules()
    assert len(modules) > 50  # the scan found the packages
    offenders = {path.relative_to(ROOT).as_posix(): sorted(name for name in _imports_of(path)
                                                           if name == "lab" or name.startswith("lab."))
                 for path in modules}
    assert {path: names for path, names in offenders.items() if names} == {}
