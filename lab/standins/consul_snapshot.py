"""Consul snapshot archives as `consul snapshot save` writes them: gzip tar of meta.json, state.bin and SHA256SUMS."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = ["FsmState", "SnapshotError", "build_archive", "decode_state", "encode_peers", "encode_state", "read_archive"]

# Raft FSM records (agent/structs MessageType); state.bin is a msgpack header {"LastIndex"} then
# records, each a type byte and one msgpack object. go-msgpack writes strings and []byte alike as
# old-spec raw, hence use_bin_type=False; maps come out with their keys sorted.
KVS, TOMBSTONE, INDEX, CHUNKING_STATE = 2, 5, 16, 29
HASHED = ("meta.json", "state.bin")


class SnapshotError(ValueError):
    pass


@dataclass
class FsmState:
    """The tables the stand-in keeps: KV entries (API shape, base64 values), tombstones and table indexes."""

    last_index: int
    kv: dict[str, dict[str, Any]] = field(default_factory=dict)
    tombstones: dict[str, int] = field(default_factory=dict)
    indexes: dict[str, int] = field(default_factory=dict)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=False)


def encode_peers(addresses: list[str]) -> str:
    """meta.json's legacy Peers field: the msgpack list of raft addresses, base64 as Go's JSON writes []byte."""
    return base64.b64encode(_pack(addresses)).decode()


def _dir_entry(key: str, value: bytes | None, flags: int, lock: int, create: int, modify: int) -> dict[str, Any]:
    return {"CreateIndex": create, "Flags": flags, "Key": key.encode(), "LockIndex": lock,
            "ModifyIndex": modify, "Session": b"", "Value": value or None}


def encode_state(state: FsmState) -> bytes:
    """state.bin in Consul's order: KV entries, tombstones (as DirEntries), table indexes, chunking state."""
    out = [_pack({"LastIndex": state.last_index})]
    for key in sorted(state.kv):
        e = state.kv[key]
        value = base64.b64decode(e["Value"]) if e.get("Value") else None
        entry = _dir_entry(key, value, int(e.get("Flags") or 0), int(e.get("LockIndex") or 0),
                           int(e["CreateIndex"]), int(e["ModifyIndex"]))
        out.append(bytes([KVS]) + _pack(entry))
    for key in sorted(state.tombstones):
        out.append(bytes([TOMBSTONE]) + _pack(_dir_entry(key, None, 0, 0, 0, state.tombstones[key])))
    for table in sorted(state.indexes):
        out.append(bytes([INDEX]) + _pack({"Key": table, "Value": state.indexes[table]}))
    out.append(bytes([CHUNKING_STATE]) + _pack({"ChunkMap": {}}))
    return b"".join(out)


def decode_state(data: bytes) -> FsmState:
    """The KV, tombstone and index tables; records of other types are skipped."""
    unpacker = msgpack.Unpacker(io.BytesIO(data), raw=True, strict_map_key=False)
    try:
        header = unpacker.unpack()
        state = FsmState(int(header[b"LastIndex"]))
        while kind := unpacker.read_bytes(1):
            if kind[0] in (KVS, TOMBSTONE, INDEX):
                _apply(state, kind[0], unpacker.unpack())
            else:
                unpacker.skip()
    except (msgpack.UnpackException, ValueError, TypeError, KeyError, AttributeError) as exc:
        # Real Consul panics here (the leader dies mid-restore); the stand-in refuses instead.
        raise SnapshotError(f"failed to restore snapshot: cannot decode state.bin ({type(exc).__name__})") from None
    return state


def _apply(state: FsmState, kind: int, rec: dict[bytes, Any]) -> None:
    if kind == INDEX:
        state.indexes[rec[b"Key"].decode()] = int(rec[b"Value"])
        return
    key = rec[b"Key"].decode("utf-8", errors="replace")
    if kind == TOMBSTONE:
        state.tombstones[key] = int(rec[b"ModifyIndex"])
        return
    value = rec.get(b"Value")
    state.kv[key] = {
        "Key": key,
        "Flags": int(rec.get(b"Flags") or 0),
        "Value": None if value is None else base64.b64encode(value).decode(),
        "LockIndex": int(rec.get(b"LockIndex") or 0),
        "CreateIndex": int(rec[b"CreateIndex"]),
        "ModifyIndex": int(rec[b"ModifyIndex"]),
    }


def _member(tar: io.BytesIO, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, int(mtime)
    tar.write(info.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512))


def build_archive(meta: dict[str, Any], state: bytes, mtime: float) -> bytes:
    """meta.json gets raft's Size field; like Go's archive/tar, the tar stops after its two zero blocks."""
    meta_b = (json.dumps(dict(meta, Size=len(state)), separators=(",", ":")) + "\n").encode()
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n"
                   for name, data in (("meta.json", meta_b), ("state.bin", state))).encode()
    raw = io.BytesIO()
    for name, data in (("meta.json", meta_b), ("state.bin", state), ("SHA256SUMS", sums)):
        _member(raw, name, data, mtime)
    raw.write(b"\0" * 1024)
    return gzip.compress(raw.getvalue(), mtime=int(mtime))


def _decompress(body: bytes) -> bytes:
    if not body:
        raise SnapshotError("failed to decompress snapshot: EOF")
    if body[:2] != b"\x1f\x8b":
        raise SnapshotError("failed to decompress snapshot: gzip: invalid header")
    try:
        # Consul streams the gzip into the tar reader: a truncated body surfaces as a short tar.
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body)
    except zlib.error:
        raise SnapshotError("failed to read snapshot file: failed reading snapshot: flate: corrupt input") from None


def read_archive(body: bytes) -> tuple[dict[str, Any], bytes]:
    """(meta, state.bin) of a verified archive; SnapshotError carries Consul's own error texts."""
    raw = _decompress(body)
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for m in tar:
                fh = tar.extractfile(m)
                if m.name not in (*HASHED, "SHA256SUMS") or fh is None:
                    raise SnapshotError(f'failed to read snapshot file: unexpected file "{m.name}" in snapshot')
                members[m.name] = fh.read()
                if len(members[m.name]) != m.size:
                    raise EOFError
            end = tar.offset + 1024  # Go's reader stops after the two zero blocks ending the archive
    except (tarfile.TarError, EOFError, OSError):
        raise SnapshotError("failed to read snapshot file: failed to read or write snapshot data: "
                            "unexpected EOF") from None
    _verify_sums(members)
    if len(raw) > end:  # checked after the sums, as Consul does (e.g. tarfile's or GNU tar's record padding)
        raise SnapshotError(f"{len(raw) - end} unread uncompressed bytes remain")
    try:
        return json.loads(members["meta.json"]), members["state.bin"]
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"failed to read snapshot file: failed to decode snapshot metadata: {exc}") from None


def _verify_sums(members: dict[str, bytes]) -> None:
    listed: dict[str, str] = {}
    for line in members.get("SHA256SUMS", b"").decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        if name not in HASHED:
            raise SnapshotError(f'failed to read snapshot file: failed checking integrity of snapshot: '
                                f'list missing hash for "{name}"')
        listed[name] = digest.strip().lower()
    for name in HASHED:
        if name not in members or name not in listed:
            raise SnapshotError(f'failed to read snapshot file: failed checking integrity of snapshot: '
                                f'file missing for "{name}"')
        if hashlib.sha256(members[name]).hexdigest() != listed[name]:
            raise SnapshotError(f'failed to read snapshot file: failed checking integrity of snapshot: '
                                f'hash check failed for "{name}"')
