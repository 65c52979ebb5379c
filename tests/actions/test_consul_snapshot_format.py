"""Consul snapshot archives as the agent writes them: state.bin decoding, corrupt archives, restores that run once."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import tarfile
import uuid
from pathlib import Path

import consul.std
import msgpack
import pytest
import requests
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.consul import snapshots
from activities.consul.archive import ArchiveError, normalize, read_snapshot


def _save(stack, directory: Path) -> snapshots.SnapshotSaveOutput:
    return snapshots.snapshot_save(snapshots.SnapshotSaveInput(consul=stack.consul_target(), directory=str(directory)))


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def _repack(src: Path, dst: Path, state: bytes | None = None, size: int | None = None,
            sums_from: bytes | None = None, extra: dict[str, bytes] | None = None) -> Path:
    """A copy of `src` with another state.bin; its SHA256SUMS and Size match it unless told otherwise."""
    members = _members(src)
    meta = json.loads(members["meta.json"])
    if state is not None:
        members["state.bin"] = state
    meta["Size"] = len(members["state.bin"]) if size is None else size
    members["meta.json"] = json.dumps(meta).encode()
    hashed = {"meta.json": members["meta.json"], "state.bin": members["state.bin"] if sums_from is None else sums_from}
    members["SHA256SUMS"] = "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in hashed.items()).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in {**members, **(extra or {})}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dst.write_bytes(gzip.compress(raw.getvalue()))
    return dst


def _step() -> ActivityEnvironment:
    """One Temporal step: every run of this environment is an attempt of the same activity."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id=f"wf-{uuid.uuid4()}", activity_id="restore")
    return env


def test_decodes_the_kv_table_of_an_agent_snapshot(stack, tmp_path):
    admin = stack.admin()
    want = {
        "fmt/bin": (b"\x00\xff\xfe\x80 not utf-8", 0),
        "fmt/flags": (b"flagged", 42),
        "fmt/flags-max": (b"x", 2**64 - 1),
        "fmt/nested/a/b/c/d": (b"deep", 7),
        "fmt/empty": (b"", 3),
        "fmt/text": ("ünïcode ✓".encode(), 0),
        "fmt/ключ": (b"cyrillic key", 0),
    }
    for key, (value, flags) in want.items():
        assert admin.kv.put(key, value, flags=flags)
    saved = _save(stack, tmp_path)
    snap = read_snapshot(Path(saved.path))
    for key, (value, flags) in want.items():
        assert snap.kv[key] == (normalize(value), flags), key
    assert snap.kv["fmt/empty"] == (None, 3)  # Consul stores an empty PUT as null
    _, live = admin.kv.get("", recurse=True)
    assert {e["Key"]: (normalize(e["Value"]), e["Flags"]) for e in live} == snap.kv  # the whole table, no more
    assert snap.meta["Size"] == len(_members(Path(saved.path))["state.bin"]) and snap.records > len(want)
    assert snap.last_index >= max(e["ModifyIndex"] for e in live)


def test_corrupt_or_truncated_archives_raise_archive_error(stack, tmp_path):
    stack.admin().kv.put("fmt/corrupt", "intact")
    src = Path(_save(stack, tmp_path).path)
    state = _members(src)["state.bin"]
    flipped = bytearray(state)
    flipped[len(state) // 2] ^= 0xFF
    cases = {
        "not a readable snapshot archive": src.read_bytes()[: src.stat().st_size // 2],
        "sha256 mismatch for state.bin": _repack(src, tmp_path / "a", bytes(flipped), sums_from=state),
        "state.bin is truncated: it ends inside record": _repack(src, tmp_path / "b", state[:-3]),
        "state.bin is truncated: it ends inside the header": _repack(src, tmp_path / "c", b""),
        "is not valid msgpack": _repack(src, tmp_path / "d", state + b"\x02\xc1"),
        "is not a KV entry": _repack(src, tmp_path / "e", state + b"\x02\x2a"),
        "meta.json says": _repack(src, tmp_path / "f", size=len(state) + 1),
        "unexpected entry 'notes.txt'": _repack(src, tmp_path / "g", extra={"notes.txt": b"hi"}),
    }
    for i, (message, case) in enumerate(cases.items()):
        path = case if isinstance(case, Path) else tmp_path / f"cut{i}.snap"
        if not isinstance(case, Path):
            path.write_bytes(case)
        with pytest.raises(ArchiveError, match=message):
            read_snapshot(path)
    # Real Consul panics on a state.bin it cannot decode: the restore refuses before anything is sent.
    corrupt = snapshots.SnapshotRestoreInput(consul=stack.consul_target(), path=str(cases["is not valid msgpack"]))
    with pytest.raises(ApplicationError) as err:
        snapshots.snapshot_restore(corrupt)
    assert err.value.non_retryable and "\n" not in str(err.value) and "state.bin is corrupt" in str(err.value)
    assert stack.admin().kv.get("fmt/corrupt")[1]["Value"] == b"intact"


def test_unknown_record_types_are_skipped(stack, tmp_path):
    stack.admin().kv.put("fmt/skip", "kept")
    src = Path(_save(stack, tmp_path).path)
    state = _members(src)["state.bin"]
    odd = msgpack.packb({"Nested": {1: [b"x", {"Deep": None}]}, "Blob": b"\x00" * 70000}, use_bin_type=False)
    grown = _repack(src, tmp_path / "grown.snap", state + b"\x3f" + odd + b"\xc8" + msgpack.packb([1, 2, 3]))
    assert read_snapshot(grown).kv == read_snapshot(src).kv and read_snapshot(grown).kv["fmt/skip"][0]


def test_restore_retried_after_success_does_not_put_again(stack, tmp_path):
    admin = stack.admin()
    admin.kv.put("fmt/retry/k", "from the snapshot")
    saved = _save(stack, tmp_path)
    admin.kv.put("fmt/retry/k", "drifted")
    step = _step()
    inp = snapshots.SnapshotRestoreInput(consul=stack.consul_target(), path=saved.path, expect_sha256=saved.sha256)
    first = step.run(snapshots.snapshot_restore, inp)
    assert first.restored and first.verified and not first.resumed and first.journal_key
    assert admin.kv.get("fmt/retry/k")[1]["Value"] == b"from the snapshot"
    # Work carries on after the restore; then the same step is retried (its completion was lost).
    admin.kv.put("fmt/retry/k", "written after the restore")
    admin.kv.put("fmt/retry/new", "also after")
    again = step.run(snapshots.snapshot_restore, inp)
    assert again.restored and again.resumed and again.verified
    assert again.written_since == ["fmt/retry/k", "fmt/retry/new"] and not again.preview.in_sync
    assert admin.kv.get("fmt/retry/k")[1]["Value"] == b"written after the restore"
    assert admin.kv.get("fmt/retry/new")[1]["Value"] == b"also after"
    # Another step asking for the same restore is a new decision: it does restore.
    other = _step().run(snapshots.snapshot_restore, inp)
    assert other.restored and not other.resumed and admin.kv.get("fmt/retry/new")[1] is None


def test_restore_whose_response_was_lost_still_counts_once(stack, tmp_path, monkeypatch):
    admin = stack.admin()
    admin.kv.put("fmt/lost/k", "from the snapshot")
    saved = _save(stack, tmp_path)
    admin.kv.put("fmt/lost/k", "drifted")
    sent = []
    put = consul.std.HTTPClient.put

    def reset_after_upload(self, callback, path, *args, **kwargs):
        result = put(self, callback, path, *args, **kwargs)
        if path == "/v1/snapshot":
            sent.append(path)
            raise requests.ConnectionError("connection reset before the response arrived")
        return result

    monkeypatch.setattr(consul.std.HTTPClient, "put", reset_after_upload)
    out = snapshots.snapshot_restore(snapshots.SnapshotRestoreInput(consul=stack.consul_target(), path=saved.path))
    assert out.restored and out.verified and sent == ["/v1/snapshot"]
    assert admin.kv.get("fmt/lost/k")[1]["Value"] == b"from the snapshot"
