"""The lab's record of the faults in place (<state>/faults.json), so `clear` knows what to undo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.settings import LabConfig

__all__ = ["fault_file", "forget", "recorded", "remember"]


def fault_file(cfg: LabConfig) -> Path:
    return cfg.path("faults.json")


def recorded(cfg: LabConfig) -> dict[str, Any]:
    path = fault_file(cfg)
    return json.loads(path.read_text()) if path.exists() else {}


def remember(cfg: LabConfig, name: str, value: Any) -> None:
    data = recorded(cfg)
    data[name] = value
    fault_file(cfg).write_text(json.dumps(data))


def forget(cfg: LabConfig, name: str) -> None:
    data = recorded(cfg)
    if data.pop(name, None) is not None:
        fault_file(cfg).write_text(json.dumps(data))
