"""Files that hold secrets (Consul snapshots carry every ACL token): owner-only, created so from the start."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

__all__ = ["open_private", "private_directory"]


def private_directory(path: Path) -> None:
    """Create `path` (and its parents) if missing; the directory itself ends owner-only (0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        path.chmod(0o700)


def open_private(path: Path) -> IO[bytes]:
    """Open `path` for writing, created 0600 (never readable by others, not even for a moment), truncated."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: make it private too
    return os.fdopen(fd, "wb")
