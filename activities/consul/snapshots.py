"""Consul snapshot actions: save a forensic copy, select one by its raft time, preview and restore it."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import consul
from consul.callback import CB
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities._clients import ConsulTarget, bad, call, consul_client, consul_http, describe, heartbeat, unavailable
from activities._files import open_private, private_directory
from activities.binding import implements
from activities.consul._kv import _read_prefix
from activities.consul.archive import ArchiveError, append_kv, kv_diff, normalize, read_meta, read_snapshot, taken_at
from activities.contracts.consul_snapshots import (
    SNAPSHOT_PREVIEW,
    SNAPSHOT_RESTORE,
    SNAPSHOT_SAVE,
    SNAPSHOT_SELECT,
    SnapshotPreview,
    SnapshotPreviewInput,
    SnapshotRestoreInput,
    SnapshotRestoreOutput,
    SnapshotSaveInput,
    SnapshotSaveOutput,
    SnapshotSelectInput,
    SnapshotSelectOutput,
)

__all__ = ["RESTORE_JOURNAL", "snapshot_preview", "snapshot_restore", "snapshot_save", "snapshot_select"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _step_tag() -> str:
    # A retried attempt of the same step gets the same file name, so it can reuse a finished file.
    if activity.in_activity():
        info = activity.info()
        return hashlib.sha256(f"{info.workflow_id}/{info.activity_id}".encode()).hexdigest()[:12]
    return hashlib.sha256(os.urandom(16)).hexdigest()[:12]


@implements(SNAPSHOT_SAVE)
def snapshot_save(inp: SnapshotSaveInput) -> SnapshotSaveOutput:
    directory = Path(inp.directory)
    try:
        private_directory(directory)  # snapshots hold every ACL token: 0700 directories, 0600 files
    except OSError as exc:
        raise bad(f"cannot create snapshot directory {directory}: {exc.strerror}") from None
    tag = _step_tag()
    done = next(iter(sorted(directory.glob(f"{inp.prefix}-*-{tag}.snap"))), None)
    if done is not None:
        try:
            meta = read_snapshot(done).meta
            return SnapshotSaveOutput(path=str(done), size=done.stat().st_size, sha256=_sha256(done),
                                      index=int(meta.get("Index", 0)), snapshot_id=str(meta.get("ID")),
                                      taken_at=taken_at(meta), reused=True)
        except ArchiveError:
            done.unlink(missing_ok=True)  # a torn file from a crashed attempt: take a fresh one
    client = consul_client(inp.consul)
    tmp = directory / f".{inp.prefix}-{tag}.tmp"
    params: list[tuple[str, Any]] = [("dc", inp.consul.datacenter)] if inp.consul.datacenter else []
    if inp.stale:
        params.append(("stale", "true"))
    digest, size = hashlib.sha256(), 0
    try:
        # Streamed through py-consul's own session: snapshots can be far larger than memory allows.
        http = consul_http(client)
        resp = http.session.get(http.uri("/v1/snapshot", params), headers=client.prepare_headers(),
                                stream=True, verify=http.verify, timeout=inp.consul.timeout_seconds)
        if resp.status_code == 403:
            raise ApplicationError("consul.snapshot.save: Consul denied the request (needs a management token)",
                                   type="PermissionDenied", non_retryable=True)
        if resp.status_code != 200:
            raise unavailable(f"consul.snapshot.save: HTTP {resp.status_code}: {resp.text[:300]}")
        index = int(resp.headers.get("X-Consul-Index", "0") or 0)
        with open_private(tmp) as fh:
            for chunk in resp.iter_content(1 << 20):
                fh.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                heartbeat({"bytes": size})
            fh.flush()
            os.fsync(fh.fileno())
    except ApplicationError:
        tmp.unlink(missing_ok=True)
        raise
    except Exception as exc:  # noqa: BLE001 - any transport failure: clean up, let Temporal retry
        tmp.unlink(missing_ok=True)
        raise unavailable(f"consul.snapshot.save: {describe(exc)}") from None
    try:
        meta = read_snapshot(tmp).meta
        when = taken_at(meta)
    except ArchiveError as exc:
        tmp.unlink(missing_ok=True)
        raise unavailable(f"consul.snapshot.save: the server sent an unreadable archive: {exc}") from None
    final = directory / f"{inp.prefix}-{when.strftime('%Y%m%dT%H%M%SZ')}-{index}-{tag}.snap"
    os.replace(tmp, final)
    return SnapshotSaveOutput(path=str(final), size=size, sha256=digest.hexdigest(), index=index,
                              snapshot_id=str(meta.get("ID")), taken_at=when, reused=False)


@implements(SNAPSHOT_SELECT)
def snapshot_select(inp: SnapshotSelectInput) -> SnapshotSelectOutput:
    store = Path(inp.store)
    if not store.is_dir():
        raise bad(f"snapshot store {store} is not a directory")
    best: tuple[datetime, Path, dict[str, Any]] | None = None
    considered, unreadable = 0, []
    for path in sorted(store.glob(inp.pattern)):
        if not path.is_file():
            continue
        considered += 1
        try:
            meta = read_meta(path)
            when = taken_at(meta)
        except ArchiveError as exc:
            unreadable.append(str(exc))
            continue
        if when < inp.before and (best is None or when > best[0]):
            best = (when, path, meta)
    if best is None:
        raise ApplicationError(
            f"no readable snapshot in {store} ({inp.pattern}) taken before {inp.before.isoformat()} "
            f"({considered} files, {len(unreadable)} unreadable)", type="NotFound", non_retryable=True)
    when, path, meta = best
    age = (datetime.now(UTC) - when).total_seconds()
    if inp.max_age_seconds is not None and age > inp.max_age_seconds:
        raise ApplicationError(f"newest snapshot before {inp.before.isoformat()} is {path.name}, "
                               f"{age:.0f}s old: older than max_age_seconds={inp.max_age_seconds:.0f}",
                               type="TooOld", non_retryable=True)
    return SnapshotSelectOutput(path=str(path), taken_at=when, age_seconds=round(age, 3),
                                snapshot_id=str(meta.get("ID")), index=int(meta.get("Index", 0)),
                                considered=considered, unreadable=unreadable)


# Restores write one entry here, inside the restored archive itself (see snapshot_restore). The
# prefix is bookkeeping: previews and verification leave it out on both sides.
RESTORE_JOURNAL = "coldstart/journal/snapshot-restores/"


def _live_kv(client: consul.Consul) -> tuple[int, dict[str, dict[str, Any]]]:
    """Every KV entry as read (with its indexes) and the KV index the read was answered at."""
    index, entries = _read_prefix(client, "")
    return index, {e["Key"]: e for e in entries}


def _comparable(entries: dict[str, Any]) -> dict[str, tuple[str | None, int]]:
    return {k: (normalize(e.get("Value")), int(e.get("Flags") or 0))
            for k, e in entries.items() if not k.startswith(RESTORE_JOURNAL)}


def _preview(client: consul.Consul, path: Path,
             max_keys: int) -> tuple[SnapshotPreview, dict[str, tuple[str | None, int]], int]:
    """(preview, the snapshot's KV, the cluster's KV index when it was compared)."""
    if not path.is_file():
        raise bad(f"snapshot {path} does not exist")
    try:
        snap = read_snapshot(path)
        when = taken_at(snap.meta)
    except ArchiveError as exc:
        raise bad(f"snapshot {path} is unusable: {exc}") from None
    target = {k: v for k, v in snap.kv.items() if not k.startswith(RESTORE_JOURNAL)}
    index, live = _live_kv(client)
    added, removed, changed = kv_diff(_comparable(live), target)
    total = len(added) + len(removed) + len(changed)
    preview = SnapshotPreview(
        path=str(path), snapshot_id=str(snap.meta.get("ID")), taken_at=when,
        age_seconds=round((datetime.now(UTC) - when).total_seconds(), 3),
        index=int(snap.meta.get("Index", 0)), sha256=_sha256(path), in_sync=total == 0,
        added=added[:max_keys], removed=removed[:max_keys], changed=changed[:max_keys],
        added_count=len(added), removed_count=len(removed), changed_count=len(changed),
        truncated=max(len(added), len(removed), len(changed)) > max_keys)
    return preview, target, index


@implements(SNAPSHOT_PREVIEW)
def snapshot_preview(inp: SnapshotPreviewInput) -> SnapshotPreview:
    return _preview(consul_client(inp.consul), Path(inp.path), inp.max_keys)[0]


def _journal(client: consul.Consul, key: str) -> dict[str, Any] | None:
    """This step's restore record, if a restore carrying it has been applied."""
    _, entry = call(f"read KV {key}", lambda: client.kv.get(key))
    try:
        return json.loads(entry["Value"]) if entry and entry.get("Value") else None
    except (ValueError, TypeError):
        return None


def _put_snapshot(client: consul.Consul, target: ConsulTarget, path: Path, journal: str,
                  record: dict[str, Any]) -> None:
    """PUT the archive with the journal entry added; a lost response still counts if the entry is there."""
    params: list[tuple[str, Any]] = [("dc", target.datacenter)] if target.datacenter else []
    with tempfile.TemporaryDirectory(prefix="coldstart-restore-") as tmp:
        archive = Path(tmp) / path.name
        try:
            append_kv(path, archive, journal, json.dumps(record, sort_keys=True).encode(), record["sha256"])
        except ArchiveError as exc:
            raise bad(f"snapshot {path} is unusable: {exc}") from None
        with archive.open("rb") as fh:
            try:
                # A file object makes requests stream the body instead of loading the archive (py-consul's
                # hint names only str and bytes; it hands data to requests as it is).
                call("consul.snapshot.restore", lambda: consul_http(client).put(
                    CB.boolean(), "/v1/snapshot", params=params, data=fh,  # pyright: ignore[reportArgumentType]
                    headers=client.prepare_headers()))
            except ApplicationError as exc:
                try:
                    applied = _journal(client, journal) == record
                except ApplicationError:
                    applied = False
                if not applied:
                    raise exc from None


def _check_restored(client: consul.Consul, target: dict[str, tuple[str | None, int]], journal: str,
                    since: int) -> tuple[bool, list[str], list[str]]:
    """(journal entry present, keys written after the restore, keys differing from the snapshot otherwise).

    A restore brings entries back with the snapshot's own indexes and every later write gets a raft
    index above `since` (the KV index read before the restore), so a difference with a higher index
    is someone's write since. A snapshot key that is missing cannot be dated (tombstones are not
    readable), so it counts as unexplained.
    """
    _, live = _live_kv(client)
    present = journal in live
    added, removed, changed = kv_diff(_comparable(live), target)
    later = sorted([k for k in removed if int(live[k]["CreateIndex"]) > since]
                   + [k for k in changed if int(live[k]["ModifyIndex"]) > since])
    unexplained = sorted(set(added + removed + changed) - set(later))
    return present, later, unexplained


@implements(SNAPSHOT_RESTORE)
def snapshot_restore(inp: SnapshotRestoreInput) -> SnapshotRestoreOutput:
    client = consul_client(inp.consul)
    path = Path(inp.path)
    preview, target, index_before = _preview(client, path, inp.max_keys)
    if inp.expect_sha256 and preview.sha256 != inp.expect_sha256.lower():
        raise bad(f"snapshot {path} changed since it was approved (sha256 {preview.sha256[:12]}…, "
                  f"expected {inp.expect_sha256[:12]}…)")
    journal = f"{RESTORE_JOURNAL}{_step_tag()}"
    earlier = _journal(client, journal)
    if earlier is not None and earlier.get("sha256") == preview.sha256:
        return _resumed(client, preview, target, journal, int(earlier.get("kv_index_before", 0)))
    if preview.in_sync and not inp.force:
        return SnapshotRestoreOutput(restored=False, preview=preview, verified=True, seconds=0.0)
    heartbeat({"phase": "restoring", "sha256": preview.sha256, "journal_key": journal})
    started = time.monotonic()
    record = {"sha256": preview.sha256, "snapshot_id": preview.snapshot_id, "kv_index_before": index_before}
    _put_snapshot(client, inp.consul, path, journal, record)
    seconds = round(time.monotonic() - started, 3)
    present, later, unexplained = _check_restored(client, target, journal, index_before)
    if not present:
        raise unavailable(f"Consul accepted {path.name} but its KV lacks the restore's journal entry {journal}: "
                          "the restore did not take effect, or another one replaced it", retryable=False)
    if unexplained:
        raise unavailable(f"restored {path.name} but the KV reads back different: {len(unexplained)} keys differ "
                          f"(e.g. {', '.join(unexplained[:5])}); the restore DID run", retryable=False)
    return SnapshotRestoreOutput(restored=True, preview=preview, verified=True, written_since=later,
                                 journal_key=journal, seconds=seconds)


def _resumed(client: consul.Consul, preview: SnapshotPreview, target: dict[str, tuple[str | None, int]],
             journal: str, since: int) -> SnapshotRestoreOutput:
    """An earlier attempt of this step restored the snapshot: verify, never PUT again."""
    _, later, unexplained = _check_restored(client, target, journal, since)
    notes = [f"an earlier attempt restored this snapshot (journal {journal}); not sent again"]
    if unexplained:
        notes.append(f"{len(unexplained)} keys differ from the snapshot without a later write to explain it "
                     f"(deleted since, or never restored): {', '.join(unexplained[:5])}")
    return SnapshotRestoreOutput(restored=True, resumed=True, preview=preview, verified=not unexplained,
                                 written_since=later, journal_key=journal, seconds=0.0, notes=notes)
