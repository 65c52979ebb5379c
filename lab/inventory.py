"""Writing the lab's target file; the inventory contract itself is activities/inventory.py."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from activities.inventory import Inventory

__all__ = ["write_inventory"]


def write_inventory(inventory: Inventory, path: str | Path) -> Path:
    """Write atomically (a runbook never reads half a file); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    header = "# Written by `coldstart lab up`; removed by `coldstart lab down`. Schema: activities/inventory.py\n"
    tmp.write_text(header + yaml.safe_dump(inventory.model_dump(mode="json", exclude_none=True), sort_keys=False))
    os.replace(tmp, path)
    return path
