"""Snapshot archives altered for the tests: another state.bin, the agent's SHA256SUMS kept for it."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["with_state"]


def with_state(src: Path, dst: Path, change: Callable[[bytes], bytes], *, later_ms: int = 0) -> None:
    """`src` with its state.bin changed (its SHA256SUMS line kept: a change shows as a mismatch). `later_ms`: taken
    that much later, meta.json's snapshot ID and its SHA256SUMS line rewritten to match (the archive is newer)."""
    with tarfile.open(src, mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}  # pyright: ignore[reportOptionalMemberAccess]
    members["state.bin"] = change(members["state.bin"])
    if later_ms:
        meta = json.loads(members["meta.json"])
        head, _, ms = str(meta["ID"]).rpartition("-")
        meta["ID"] = f"{head}-{int(ms) + later_ms}"
        members["meta.json"] = json.dumps(meta).encode()
        digest = hashlib.sha256(members["meta.json"]).hexdigest()
        members["SHA256SUMS"] = b"".join(
            f"{digest}  meta.json\n".encode() if line.endswith(b"  meta.json") else line + b"\n"
            for line in members["SHA256SUMS"].splitlines())
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dst.write_bytes(gzip.compress(raw.getvalue()))
