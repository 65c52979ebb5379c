"""Consul snapshot archives: a gzip tar of meta.json, state.json and SHA256SUMS, like `consul snapshot save`."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from typing import Any

__all__ = ["build_archive", "read_archive", "SnapshotError"]


class SnapshotError(ValueError):
    pass


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def build_archive(meta: dict[str, Any], state: dict[str, Any], mtime: float) -> bytes:
    # Same member layout as a real snapshot (meta.json, state payload, SHA256SUMS)
    # so `tar tzf` on either looks alike; the payload is JSON instead of raft's msgpack.
    meta_b = json.dumps(meta, sort_keys=True).encode()
    state_b = json.dumps(state, sort_keys=True).encode()
    sums = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n"
        for name, data in (("meta.json", meta_b), ("state.json", state_b))
    ).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        _add(tar, "meta.json", meta_b, mtime)
        _add(tar, "state.json", state_b, mtime)
        _add(tar, "SHA256SUMS", sums, mtime)
    return gzip.compress(raw.getvalue(), mtime=int(mtime))


def read_archive(body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parse and verify an archive; raises SnapshotError on any corruption."""
    try:
        raw = gzip.decompress(body)
        members: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
            for m in tar.getmembers():
                fh = tar.extractfile(m)
                if fh is not None:
                    members[m.name] = fh.read()
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise SnapshotError(f"failed to read snapshot archive: {exc}") from exc
    for name in ("meta.json", "state.json", "SHA256SUMS"):
        if name not in members:
            raise SnapshotError(f"snapshot archive is missing {name}")
    for line in members["SHA256SUMS"].decode().splitlines():
        digest, _, name = line.partition("  ")
        if name in members and hashlib.sha256(members[name]).hexdigest() != digest:
            raise SnapshotError(f"sha256 hash mismatch for {name}")
    try:
        return json.loads(members["meta.json"]), json.loads(members["state.json"])
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"corrupt snapshot payload: {exc}") from exc
