"""Finds promtool and runs it; tests skip (with the reason) only when it is truly absent."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.real import unavailable

__all__ = ["require_promtool", "run_promtool"]


def require_promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        unavailable("promtool is not on PATH (Debian: apt-get install prometheus)")
    return path


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_promtool(), *map(str, args)], capture_output=True, text=True, timeout=60,
                          check=False)
