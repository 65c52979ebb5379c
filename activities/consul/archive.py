"""Read Consul snapshot archives (gzip tar: meta.json, state.bin, SHA256SUMS) without restoring them."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

import msgpack

from activities._files import open_private
from activities.errors import InvalidInput

__all__ = ["ArchiveError", "SnapshotInfo", "append_kv", "kv_diff", "normalize", "read_meta", "read_snapshot",
           "taken_at"]

# state.bin is Consul's FSM snapshot (agent/consul/fsm): a msgpack header {"LastIndex": n}, then records,
# each one message-type byte (agent/structs MessageType) followed by one msgpack object. Strings and
# []byte both travel as msgpack raw/str (go-msgpack's old spec), so values need not be valid UTF-8.
KVS_RECORD = 2  # structs.KVSRequestType: a DirEntry {Key, Value, Flags, LockIndex, Session, Create/ModifyIndex}
MEMBERS = ("meta.json", "state.bin", "SHA256SUMS")
_CHUNK = 1 << 20


class ArchiveError(InvalidInput):
    """The file is not a readable, intact snapshot archive."""


@dataclass
class SnapshotInfo:
    meta: dict[str, Any]
    # key -> (base64 value or None for empty, flags)
    kv: dict[str, tuple[str | None, int]]
    last_index: int
    records: int


def taken_at(meta: dict[str, Any]) -> datetime:
    """When raft took the snapshot: its ID is "<term>-<index>-<unix ms>" (hashicorp/raft snapshot stores)."""
    ident = str(meta.get("ID", ""))
    try:
        ms = int(ident.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise ArchiveError(f"snapshot ID {ident!r} does not end in a millisecond timestamp") from None
    return datetime.fromtimestamp(ms / 1000, UTC)


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


class _Hashing:
    """A read-only stream that hashes and counts what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha, self.size = raw, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


def read_snapshot(path: Path) -> SnapshotInfo:
    """Verify the archive against its SHA256SUMS and decode the KV table from state.bin, in one streamed pass."""
    digests: dict[str, str] = {}
    small: dict[str, bytes] = {}
    decoded: tuple[dict[str, tuple[str | None, int]], int, int] | None = None
    problem: ArchiveError | None = None
    state_size = 0
    try:
        with tarfile.open(path, mode="r|gz") as tar:
            for member in tar:
                fh = tar.extractfile(member)
                if member.name not in MEMBERS or fh is None:
                    raise ArchiveError(f"{path.name}: unexpected entry {member.name!r} in snapshot archive")
                if member.name != "state.bin":
                    small[member.name] = fh.read()
                    digests[member.name] = hashlib.sha256(small[member.name]).hexdigest()
                    continue
                stream = _Hashing(fh)
                try:
                    decoded = _decode_state(stream)
                except ArchiveError as exc:
                    problem = exc  # reported after the checksums, which name a corrupt file more precisely
                stream.drain()
                digests["state.bin"], state_size = stream.sha.hexdigest(), stream.size
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise ArchiveError(f"{path.name}: not a readable snapshot archive ({exc})") from None
    missing = [name for name in MEMBERS if name not in digests]
    if missing:
        raise ArchiveError(f"{path.name}: archive lacks {', '.join(missing)}")
    _check_sums(path.name, small["SHA256SUMS"], digests)
    meta = _meta(path.name, small["meta.json"])
    if "Size" in meta and meta["Size"] != state_size:
        raise ArchiveError(f"{path.name}: state.bin has {state_size} bytes but meta.json says {meta['Size']}")
    if problem is not None:
        raise ArchiveError(f"{path.name}: {problem}")
    assert decoded is not None  # state.bin is among MEMBERS: it was there and decoded, or this raised above
    kv, last_index, records = decoded
    return SnapshotInfo(meta, kv, last_index, records)


def _check_sums(name: str, text: bytes, digests: dict[str, str]) -> None:
    """Consul's rule: meta.json and state.bin are both listed, and every listed file matches."""
    listed: dict[str, str] = {}
    for line in text.decode(errors="replace").splitlines():
        digest, sep, member = line.partition("  ")
        if not sep or member not in ("meta.json", "state.bin") or len(digest) != 64:
            raise ArchiveError(f"{name}: malformed SHA256SUMS line {line[:80]!r}")
        listed[member] = digest.lower()
    for member in ("meta.json", "state.bin"):
        if member not in listed:
            raise ArchiveError(f"{name}: SHA256SUMS has no hash for {member}")
        if listed[member] != digests[member]:
            raise ArchiveError(f"{name}: sha256 mismatch for {member} (corrupt or altered)")


def _meta(name: str, data: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"{name}: corrupt meta.json ({exc})") from None
    if not isinstance(meta, dict):
        raise ArchiveError(f"{name}: meta.json is not a JSON object")
    return meta


def _decode_state(stream: _Hashing) -> tuple[dict[str, tuple[str | None, int]], int, int]:
    """(KV table, header LastIndex, record count); every record is parsed, only KV entries are kept."""
    unpacker = msgpack.Unpacker(stream, raw=True, strict_map_key=False)
    header = _next(unpacker, "the header", 0)
    if not isinstance(header, dict) or not isinstance(header.get(b"LastIndex"), int):
        raise ArchiveError("state.bin does not start with a snapshot header ({LastIndex})")
    kv: dict[str, tuple[str | None, int]] = {}
    records = 0
    while True:
        offset = unpacker.tell()
        kind = unpacker.read_bytes(1)
        if not kind:
            return kv, header[b"LastIndex"], records
        records += 1
        what = f"record {records} (type {kind[0]}) at byte {offset}"
        if kind[0] == KVS_RECORD:
            key, value = _kv_entry(_next(unpacker, what, offset), what)
            kv[key] = value
        else:
            _next(unpacker, what, offset, skip=True)  # other tables (catalog, ACLs, ...) are not needed


def _next(unpacker: msgpack.Unpacker, what: str, offset: int, skip: bool = False) -> Any:
    try:
        return unpacker.skip() if skip else unpacker.unpack()
    except msgpack.OutOfData:
        raise ArchiveError(f"state.bin is truncated: it ends inside {what}") from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        detail = f" ({exc})" if str(exc) else ""
        raise ArchiveError(f"state.bin is corrupt: {what} is not valid msgpack{detail}") from None


def _kv_entry(entry: Any, what: str) -> tuple[str, tuple[str | None, int]]:
    key, value, flags = (entry.get(b"Key"), entry.get(b"Value"), entry.get(b"Flags", 0)) \
        if isinstance(entry, dict) else (None, None, None)
    if not isinstance(key, bytes) or not (value is None or isinstance(value, bytes)) or not isinstance(flags, int):
        raise ArchiveError(f"state.bin is corrupt: {what} is not a KV entry")
    # Consul's HTTP API shows keys as JSON strings: invalid UTF-8 comes out as U+FFFD there too.
    return key.decode("utf-8", errors="replace"), (normalize(value), flags)


def append_kv(src: Path, dst: Path, key: str, value: bytes, expect_sha256: str) -> None:
    """Copy archive `src` to `dst` with one more KV entry at the end of state.bin (new Size and SHA256SUMS).

    Written as Consul writes archives (members meta.json, state.bin, SHA256SUMS; the tar ends right
    after its two zero blocks, which Consul insists on), streaming state.bin through. `src` must still
    have the digest `expect_sha256` (the file that was verified and approved).
    """
    meta: dict[str, Any] | None = None
    try:
        with src.open("rb") as fh:
            source = _Hashing(fh)
            # A stream ("r|") is only read; typeshed asks of fileobj what the seeking modes use too.
            with (
                tarfile.open(fileobj=source, mode="r|gz") as tar,  # pyright: ignore[reportCallIssue, reportArgumentType]
                open_private(dst) as raw,
                gzip.GzipFile(fileobj=raw, mode="wb") as out,
            ):
                for member in tar:
                    data = tar.extractfile(member)
                    if member.name == "meta.json" and data is not None:
                        meta = _meta(src.name, data.read())
                    elif member.name == "state.bin" and data is not None:
                        if meta is None:
                            raise ArchiveError(f"{src.name}: state.bin comes before meta.json")
                        record = _kv_record(key, value, int(meta.get("Index", 0)))
                        _write_members(out, meta, data, member.size, record)
                        break
                else:
                    raise ArchiveError(f"{src.name}: archive lacks meta.json or state.bin")
            source.drain()
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise ArchiveError(f"{src.name}: not a readable snapshot archive ({exc})") from None
    if source.sha.hexdigest() != expect_sha256:
        raise ArchiveError(f"{src.name}: the file changed while it was being read (sha256 differs)")


def _kv_record(key: str, value: bytes, index: int) -> bytes:
    entry = {"CreateIndex": index, "Flags": 0, "Key": key.encode(), "LockIndex": 0, "ModifyIndex": index,
             "Session": b"", "Value": value or None}
    # packb returns the bytes (only a Packer that keeps its buffer returns None).
    return bytes([KVS_RECORD]) + cast(bytes, msgpack.packb(entry, use_bin_type=False))


def _write_members(out: gzip.GzipFile, meta: dict[str, Any], state: IO[bytes], size: int, extra: bytes) -> None:
    sums = hashlib.sha256()
    meta_b = (json.dumps(dict(meta, Size=size + len(extra)), separators=(",", ":")) + "\n").encode()
    _tar_member(out, "meta.json", len(meta_b), [meta_b])
    _tar_member(out, "state.bin", size + len(extra), _tee(state, sums, extra))
    listing = f"{hashlib.sha256(meta_b).hexdigest()}  meta.json\n{sums.hexdigest()}  state.bin\n".encode()
    _tar_member(out, "SHA256SUMS", len(listing), [listing])
    out.write(b"\0" * 1024)


def _tee(src: IO[bytes], sha: Any, extra: bytes) -> Iterator[bytes]:
    for chunk in iter(lambda: src.read(_CHUNK), b""):
        sha.update(chunk)
        yield chunk
    sha.update(extra)
    yield extra


def _tar_member(out: gzip.GzipFile, name: str, size: int, chunks: Iterable[bytes]) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o600, int(time.time())
    out.write(info.tobuf(tarfile.PAX_FORMAT))
    written = 0
    for chunk in chunks:
        out.write(chunk)
        written += len(chunk)
    if written != size:
        raise ArchiveError(f"{name}: expected {size} bytes, read {written} (truncated archive)")
    out.write(b"\0" * (-size % 512))


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
