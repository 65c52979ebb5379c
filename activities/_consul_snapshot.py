"""Read Consul snapshot archives (gzip tar: meta.json, state payload, SHA256SUMS) without restoring them."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["ArchiveError", "SnapshotInfo", "kv_diff", "read_meta", "read_snapshot", "taken_at"]


class ArchiveError(ValueError):
    """The file is not a readable, intact snapshot archive."""


@dataclass
class SnapshotInfo:
    meta: dict[str, Any]
    # key -> (base64 value or None, flags); None when the payload format is not one we can decode.
    kv: dict[str, tuple[str | None, int]] | None
    payload: str
    problems: list[str] = field(default_factory=list)


def taken_at(meta: dict[str, Any]) -> datetime:
    """When raft took the snapshot: its ID is "<term>-<index>-<unix ms>" (hashicorp/raft file snapshots)."""
    ident = str(meta.get("ID", ""))
    try:
        ms = int(ident.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise ArchiveError(f"snapshot ID {ident!r} does not end in a millisecond timestamp") from None
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def read_meta(path: Path) -> dict[str, Any]:
    """meta.json only, reading the archive as a stream and stopping there (snapshots can be large)."""
    try:
        with tarfile.open(path, mode="r|gz") as tar:
            for member in tar:
                if member.name == "meta.json":
                    fh = tar.extractfile(member)
                    if fh is None:
                        break
                    return json.loads(fh.read())
    except (OSError, EOFError, tarfile.TarError, json.JSONDecodeError) as exc:
        raise ArchiveError(f"{path.name}: not a readable snapshot archive ({exc})") from None
    raise ArchiveError(f"{path.name}: archive has no meta.json")


def read_snapshot(path: Path) -> SnapshotInfo:
    """Verify SHA256SUMS and decode the KV table from the state payload."""
    try:
        raw = gzip.decompress(path.read_bytes())
        members: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
            for m in tar.getmembers():
                fh = tar.extractfile(m)
                if fh is not None:
                    members[m.name] = fh.read()
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise ArchiveError(f"{path.name}: not a readable snapshot archive ({exc})") from None
    if "meta.json" not in members or "SHA256SUMS" not in members:
        raise ArchiveError(f"{path.name}: archive lacks meta.json or SHA256SUMS")
    for line in members["SHA256SUMS"].decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        if name and name in members and hashlib.sha256(members[name]).hexdigest() != digest.strip():
            raise ArchiveError(f"{path.name}: sha256 mismatch for {name}")
    try:
        meta = json.loads(members["meta.json"])
    except json.JSONDecodeError as exc:
        raise ArchiveError(f"{path.name}: corrupt meta.json ({exc})") from None
    if "state.json" in members:
        return SnapshotInfo(meta, _kv_from_json(members["state.json"], path.name), "state.json")
    payload = next((n for n in members if n not in ("meta.json", "SHA256SUMS")), "")
    # Consul's own payload (state.bin) is the FSM as a msgpack record stream; decoding it is
    # not implemented here, so the KV preview is reported unavailable rather than guessed.
    return SnapshotInfo(meta, None, payload, [f"KV preview unavailable: payload {payload!r} is not decoded"])


def _kv_from_json(data: bytes, name: str) -> dict[str, tuple[str | None, int]]:
    try:
        state = json.loads(data)
        table = state.get("kv", {})
        return {k: (v.get("Value"), int(v.get("Flags") or 0)) for k, v in table.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise ArchiveError(f"{name}: corrupt state payload ({exc})") from None


def normalize(value: Any) -> str | None:
    """Consul reports an empty value as null; compare both the same way."""
    if value in (None, "", b""):
        return None
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)


def kv_diff(
    current: dict[str, tuple[str | None, int]], target: dict[str, tuple[str | None, int]]
) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, changed) keys if the cluster moved from `current` to `target`."""
    added = sorted(k for k in target if k not in current)
    removed = sorted(k for k in current if k not in target)
    changed = sorted(
        k for k in target
        if k in current and (normalize(current[k][0]), current[k][1]) != (normalize(target[k][0]), target[k][1])
    )
    return added, removed, changed
