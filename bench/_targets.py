"""Development targets for the benches' runs, written where the worker's catalog reads them ($COLDSTART_TARGETS);
the benches' workers are started with allow_development (--allow-development) to run their own runbooks on them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

__all__ = ["development_target", "use_development_targets"]

_DIR: list[Path] = []
_BENCH_ENV = "COLDSTART_BENCH_TARGETS"  # the directory the bench made, for the processes it starts


def use_development_targets() -> Path:
    """A fresh targets directory for this bench, in $COLDSTART_TARGETS, so its workers (in this process or
    started from it) resolve the bench's runs against it like a controller's catalog."""
    if not _DIR:
        # A bench's own worker process (started from the bench's file) imports this too: it reads the directory
        # its bench made, not a new empty one.
        inherited = os.environ.get(_BENCH_ENV)
        _DIR.append(Path(inherited) if inherited else Path(tempfile.mkdtemp(prefix="coldstart-bench-targets-")))
        os.environ["COLDSTART_TARGETS"] = os.environ[_BENCH_ENV] = str(_DIR[0])
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
