"""Development targets for the benches' runs, written where the worker's catalog reads them ($COLDSTART_TARGETS)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

__all__ = ["development_target", "use_development_targets"]

_DIR: list[Path] = []


def use_development_targets() -> Path:
    """A fresh targets directory for this bench, in $COLDSTART_TARGETS, so its workers (in this process or
    started from it) resolve the bench's runs against it like a controller's catalog."""
    if not _DIR:
        _DIR.append(Path(tempfile.mkdtemp(prefix="coldstart-bench-targets-")))
        os.environ["COLDSTART_TARGETS"] = str(_DIR[0])
    return _DIR[0]


def development_target(name: str) -> dict[str, Any]:
    """A development target named `name` (a bench runs its own runbooks on it), as the catalog reads it."""
    inventory = {"name": name, "development": True, "telemetry": {"prometheus": "http://127.0.0.1:9"}}
    path = use_development_targets() / f"{name}.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump(inventory))
    return inventory


# At import, before any bench builds a worker or starts one (they read $COLDSTART_TARGETS when they do).
use_development_targets()
