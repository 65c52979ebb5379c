"""Snapshot archives altered for the tests: another state.bin, the agent's meta.json and SHA256SUMS kept."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["with_state"]


def with_state(src: Path, dst: Path, change: Callable[[bytes], bytes]) -> None:
    with tarfile.open(src, mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}  # pyright: ignore[reportOptionalMemberAccess]
    members["state.bin"] = change(members["state.bin"])
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dst.write_bytes(gzip.compress(raw.getvalue()))
