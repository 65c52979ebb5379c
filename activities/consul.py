"""Consul actions: snapshots, health, leadership, KV (with undo), the streaming flag and non-essential usage."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import os
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import consul
from consul.callback import CB
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field, field_validator, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities._clients import (
    ConsulTarget,
    NomadTarget,
    bad,
    call,
    consul_client,
    consul_get,
    consul_token,
    describe,
    go_duration_seconds,
    heartbeat,
    nomad_client,
    resume_details,
    secret_of,
    unavailable,
)
from activities._consul_snapshot import (ArchiveError, append_kv, kv_diff, normalize, read_meta, read_snapshot,
                                         taken_at)
from activities._nomad_checks import CheckPlace, check_at, differing, find_check, group_of, read_job, worst_status
from activities.registry import RetryDefaults, action

__all__ = [
    "HealthInput",
    "HealthOutput",
    "KvDeletePrefixInput",
    "KvDeletePrefixOutput",
    "KvEntry",
    "KvRestoreInput",
    "KvRestoreOutput",
    "KvSetInput",
    "KvSetOutput",
    "LeaderTransferInput",
    "LeaderTransferOutput",
    "ServerReport",
    "ServiceRecord",
    "SnapshotPreview",
    "SnapshotPreviewInput",
    "SnapshotRestoreInput",
    "SnapshotRestoreOutput",
    "SnapshotSaveInput",
    "SnapshotSaveOutput",
    "SnapshotSelectInput",
    "SnapshotSelectOutput",
    "StreamingSetInput",
    "StreamingSetOutput",
    "UserDisableInput",
    "UserDisableOutput",
    "UserEnableInput",
    "UserEnableOutput",
    "UserService",
    "UsersDisableInput",
    "UsersDisableOutput",
    "UsersEnableInput",
    "UsersEnableOutput",
    "health",
    "kv_delete_prefix",
    "kv_restore",
    "kv_set",
    "leader_transfer",
    "snapshot_preview",
    "snapshot_restore",
    "snapshot_save",
    "snapshot_select",
    "streaming_set",
    "user_disable",
    "user_enable",
    "users_disable",
    "users_enable",
]

STREAMING_KEY = "coldstart/flags/streaming"
JOURNAL_PREFIX = "coldstart/journal/users/"
CAS_ATTEMPTS = 8


# =========================================================================== KV core


class KvEntry(BaseModel):
    """One key exactly as stored: value as base64 (None = empty/null) and flags."""

    key: str
    value_base64: str | None = None
    flags: int = 0

    def raw(self) -> bytes | None:
        return base64.b64decode(self.value_base64) if self.value_base64 is not None else None


def _entry(raw: dict[str, Any]) -> KvEntry:
    # py-consul hands values back already base64-decoded.
    return KvEntry(key=raw["Key"], value_base64=normalize(raw.get("Value")), flags=int(raw.get("Flags") or 0))


def _text(entry: KvEntry | None) -> str | None:
    if entry is None or entry.value_base64 is None:
        return None
    return entry.raw().decode("utf-8", errors="replace")


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or any(c in key for c in "\n\r\0"):
        raise ValueError(f"bad KV key {key!r}: non-empty, no leading slash, no control characters")
    return key


class _Absent:
    """Desired state: the key does not exist."""


ABSENT = _Absent()


def kv_ensure(client: consul.Consul, key: str, want: bytes | None | _Absent, flags: int = 0,
              expect_index: int | None = None) -> tuple[KvEntry | None, bool, int]:
    """Make `key` hold `want` with check-and-set; returns (previous, changed, modify index after).

    expect_index guards undo steps: when the key no longer has the ModifyIndex we left it at,
    someone changed it since, and overwriting their value silently would be wrong.
    """
    for _ in range(CAS_ATTEMPTS):
        index, cur = call(f"read KV {key}", lambda: client.kv.get(key))
        previous = _entry(cur) if cur else None
        if isinstance(want, _Absent):
            if cur is None:
                return previous, False, int(index or 0)
        elif cur is not None and normalize(cur.get("Value")) == normalize(want) and int(cur.get("Flags") or 0) == flags:
            return previous, False, int(cur["ModifyIndex"])
        current_index = int(cur["ModifyIndex"]) if cur else 0
        if expect_index is not None and current_index != expect_index:
            raise ApplicationError(
                f"KV {key} changed since it was recorded (ModifyIndex {current_index}, expected {expect_index}); "
                "not overwriting it", type="Conflict", non_retryable=True)
        if isinstance(want, _Absent):
            ok = call(f"delete KV {key}", lambda: client.kv.delete(key, cas=current_index))
        else:
            ok = call(f"write KV {key}", lambda: client.kv.put(key, want or b"", cas=current_index, flags=flags))
        if ok:
            _, after = call(f"read back KV {key}", lambda: client.kv.get(key))
            if isinstance(want, _Absent):
                if after is not None:
                    raise unavailable(f"deleted KV {key} but it reads back present")
                return previous, True, 0
            if after is None or normalize(after.get("Value")) != normalize(want):
                raise unavailable(f"wrote KV {key} but it reads back differently")
            return previous, True, int(after["ModifyIndex"])
        # CAS lost a race with another writer: read again and decide again.
    raise unavailable(f"KV {key}: check-and-set kept losing to concurrent writers ({CAS_ATTEMPTS} attempts)")


def _want(entry: KvEntry | None) -> bytes | None | _Absent:
    return ABSENT if entry is None else (entry.raw() or b"")


def _read_prefix(client: consul.Consul, prefix: str) -> tuple[int, list[dict[str, Any]]]:
    index, entries = call(f"list KV {prefix}", lambda: client.kv.get(prefix, recurse=True))
    return int(index or 0), list(entries or [])


# =========================================================================== snapshots


class SnapshotSaveInput(BaseModel):
    consul: ConsulTarget
    directory: str = Field(description="directory to write the snapshot file into (created if missing)")
    prefix: str = Field(default="consul", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    stale: bool = Field(default=False, description="let any server answer (use when the leader is unhealthy)")


class SnapshotSaveOutput(BaseModel):
    path: str
    size: int
    sha256: str
    index: int
    snapshot_id: str
    taken_at: datetime
    reused: bool = Field(description="true when a retry of this step found its file already complete")


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


@action("consul.snapshot.save", timeout=1800, heartbeat=60, retry=RetryDefaults(max_attempts=3))
def snapshot_save(inp: SnapshotSaveInput) -> SnapshotSaveOutput:
    """Save a forensic copy of the cluster state (GET /v1/snapshot), streamed to a file with its sha256."""
    directory = Path(inp.directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
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
        resp = client.http.session.get(client.http.uri("/v1/snapshot", params), headers=client.prepare_headers(),
                                       stream=True, verify=client.http.verify, timeout=inp.consul.timeout_seconds)
        if resp.status_code == 403:
            raise ApplicationError("consul.snapshot.save: Consul denied the request (needs a management token)",
                                   type="PermissionDenied", non_retryable=True)
        if resp.status_code != 200:
            raise unavailable(f"consul.snapshot.save: HTTP {resp.status_code}: {resp.text[:300]}")
        index = int(resp.headers.get("X-Consul-Index", "0") or 0)
        with tmp.open("wb") as fh:
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


class SnapshotSelectInput(BaseModel):
    store: str = Field(description="directory holding snapshot archives")
    before: datetime = Field(description="pick the newest snapshot taken strictly before this (timezone required)")
    pattern: str = Field(default="*.snap", description="glob for snapshot files in the store")
    max_age_seconds: float | None = Field(default=None, gt=0, description="refuse a snapshot older than this")

    @field_validator("before")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("before needs a timezone (e.g. 2021-10-28T13:37:00Z)")
        return value


class SnapshotSelectOutput(BaseModel):
    path: str
    taken_at: datetime
    age_seconds: float
    snapshot_id: str
    index: int
    considered: int
    unreadable: list[str]


@action("consul.snapshot.select", timeout=300, retry=RetryDefaults(max_attempts=2))
def snapshot_select(inp: SnapshotSelectInput) -> SnapshotSelectOutput:
    """Pick the newest snapshot in a store taken before a time, dated by the archive's own raft metadata.

    The time comes from meta.json's ID ("<term>-<index>-<unix ms>", written by raft when the
    snapshot was taken), not the file's mtime or name: copies and rsyncs change mtimes, and
    names are whatever the tool that wrote them chose.
    """
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
    age = (datetime.now(timezone.utc) - when).total_seconds()
    if inp.max_age_seconds is not None and age > inp.max_age_seconds:
        raise ApplicationError(f"newest snapshot before {inp.before.isoformat()} is {path.name}, "
                               f"{age:.0f}s old: older than max_age_seconds={inp.max_age_seconds:.0f}",
                               type="TooOld", non_retryable=True)
    return SnapshotSelectOutput(path=str(path), taken_at=when, age_seconds=round(age, 3),
                                snapshot_id=str(meta.get("ID")), index=int(meta.get("Index", 0)),
                                considered=considered, unreadable=unreadable)


class SnapshotPreviewInput(BaseModel):
    consul: ConsulTarget
    path: str = Field(description="snapshot archive to restore")
    max_keys: int = Field(default=50, ge=0, le=5000, description="cap on each listed key set")


class SnapshotPreview(BaseModel):
    """What a restore would do, for an approval prompt."""

    path: str
    snapshot_id: str
    taken_at: datetime
    age_seconds: float
    index: int
    sha256: str
    in_sync: bool = Field(description="the cluster's KV already equals the snapshot's")
    added: list[str] = Field(default_factory=list, description="keys the restore brings back")
    removed: list[str] = Field(default_factory=list, description="keys the restore deletes")
    changed: list[str] = Field(default_factory=list, description="keys whose value or flags the restore changes")
    added_count: int = 0
    removed_count: int = 0
    changed_count: int = 0
    truncated: bool = False


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
        age_seconds=round((datetime.now(timezone.utc) - when).total_seconds(), 3),
        index=int(snap.meta.get("Index", 0)), sha256=_sha256(path), in_sync=total == 0,
        added=added[:max_keys], removed=removed[:max_keys], changed=changed[:max_keys],
        added_count=len(added), removed_count=len(removed), changed_count=len(changed),
        truncated=max(len(added), len(removed), len(changed)) > max_keys)
    return preview, target, index


@action("consul.snapshot.preview", timeout=300, retry=RetryDefaults(max_attempts=3))
def snapshot_preview(inp: SnapshotPreviewInput) -> SnapshotPreview:
    """Show what restoring a snapshot would change (age; KV keys added, removed, changed) without restoring."""
    return _preview(consul_client(inp.consul), Path(inp.path), inp.max_keys)[0]


class SnapshotRestoreInput(BaseModel):
    consul: ConsulTarget
    path: str
    expect_sha256: str | None = Field(default=None, description="refuse unless the file still has this digest "
                                      "(pin the file the approval step previewed)")
    max_keys: int = Field(default=50, ge=0, le=5000)
    force: bool = Field(default=False, description="restore even when the KV already matches the snapshot")


class SnapshotRestoreOutput(BaseModel):
    restored: bool = Field(description="this step's restore is applied (by this attempt or an earlier one)")
    resumed: bool = Field(default=False, description="an earlier attempt of this step had already restored: "
                          "nothing was sent again")
    preview: SnapshotPreview = Field(description="the cluster against the snapshot when this attempt started")
    verified: bool = Field(description="the KV read back as the snapshot's, apart from keys written since the restore")
    written_since: list[str] = Field(default_factory=list,
                                     description="keys that differ from the snapshot because they were written "
                                                 "after the restore")
    journal_key: str | None = Field(default=None, description="KV entry recording this step's restore")
    seconds: float
    notes: list[str] = Field(default_factory=list)


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
                # A file object makes requests stream the body instead of loading the archive.
                call("consul.snapshot.restore", lambda: client.http.put(
                    CB.boolean(), "/v1/snapshot", params=params, data=fh, headers=client.prepare_headers()))
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


@action("consul.snapshot.restore", timeout=1800, heartbeat=120, mutating=True,
        retry=RetryDefaults(max_attempts=3))
def snapshot_restore(inp: SnapshotRestoreInput) -> SnapshotRestoreOutput:
    """Reset the cluster to a snapshot (PUT /v1/snapshot); skipped when the KV already equals the snapshot's.

    The archive goes out with one extra KV entry, RESTORE_JOURNAL + this step's tag, so the restore and
    its record land together: a retry of the step that finds the entry does not PUT again (that would
    roll back whatever was written since) and verifies instead. No undo: take consul.snapshot.save first.
    """
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


# =========================================================================== health and leadership


class HealthInput(BaseModel):
    consul: ConsulTarget
    metrics_format: Literal["prometheus", "json"] = Field(
        default="prometheus",
        description="prometheus gives true p50s (needs telemetry.prometheus_retention_time); "
                    "json reports go-metrics' interval mean instead")
    max_kv_apply_p50_ms: float = Field(default=300.0, gt=0, description="the postmortem's 'normal' bound")
    max_leader_contact_ms: float = Field(default=200.0, gt=0, description="autopilot's LastContactThreshold")


class ServerReport(BaseModel):
    """One server asked by consul.health: did it answer, and as whom."""

    url: str
    reachable: bool
    node: str | None = Field(default=None, description="its node name, when it answered")
    leader: bool = Field(default=False, description="it says it is the raft leader")
    error: str | None = Field(default=None, description="why it did not answer")


class HealthOutput(BaseModel):
    leader: str | None = Field(description="leader node name")
    leader_address: str | None
    leader_id: str | None
    voters: list[str]
    autopilot_healthy: bool
    failure_tolerance: int
    kv_apply_p50_ms: float | None = Field(description="None: no KV applies in the agent's 10 s window")
    leader_last_contact_ms: float | None
    metrics_node: str | None = Field(description="node whose /v1/agent/metrics was read")
    metrics_from_leader: bool
    metrics_format: str
    servers: list[ServerReport] = Field(description="every server asked, in the order given, answering or not")
    unreachable: list[str] = Field(description="URLs of the servers that did not answer")
    healthy: bool = Field(description="every server answered, leader known, autopilot healthy, p50 and contact "
                                      "within bounds")
    problems: list[str]


def _probe(target: ConsulTarget, url: str, token: str | None) -> tuple[ServerReport, ApplicationError | None]:
    client = consul_client(target, url, token=token or "")
    try:
        me = call(f"read agent self at {url}", lambda: consul_get(client, "/v1/agent/self"))
    except ApplicationError as exc:
        # A denial counts as not answering too: a server that just started refuses tokens until its
        # ACLs are up ("ACL system must be bootstrapped").
        return ServerReport(url=url, reachable=False, error=str(exc)), exc
    return ServerReport(url=url, reachable=True, node=me["Config"]["NodeName"],
                        leader=str(me["Stats"]["consul"].get("leader")) == "true"), None


def _probe_servers(target: ConsulTarget, token: str | None) -> list[ServerReport]:
    """agent/self of every server URL given (or just `address`), all at once: a hung one costs one timeout.
    None answering is an error: a denial from every one is the token's (not retryable), else retryable."""
    urls = target.servers or [target.address]
    with ThreadPoolExecutor(max_workers=len(urls), thread_name_prefix="consul-health") as pool:
        probed = list(pool.map(lambda url: _probe(target, url, token), urls))
    reports = [report for report, _ in probed]
    if not any(r.reachable for r in reports):
        text = "consul.health: no server answered: " + "; ".join(f"{r.url}: {r.error}" for r in reports)
        if all(exc is not None and exc.type == "PermissionDenied" for _, exc in probed):
            raise ApplicationError(text, type="PermissionDenied", non_retryable=True)
        raise unavailable(text)
    return reports


def _from_any(target: ConsulTarget, token: str | None, servers: list[ServerReport], what: str, read: Any,
              problems: list[str]) -> Any:
    """The first answer to `read(client)` from the servers that answered (the leader's agent first); None and
    a problem when none of them can give it (e.g. no leader elected). Denied by all: the token lacks the
    right, which waiting will not fix."""
    errors: list[ApplicationError] = []
    for report in sorted(servers, key=lambda r: not r.leader):
        client = consul_client(target, report.url, token=token or "")
        try:
            return call(f"{what} at {report.url}", lambda: read(client))
        except ApplicationError as exc:
            errors.append(exc)
    if errors and all(exc.type == "PermissionDenied" for exc in errors):
        raise errors[0]
    problems.append(f"cannot {what}: {errors[0] if errors else 'no server to ask'}")
    return None


def _metric_p50s(client: consul.Consul, fmt: str) -> dict[str, float | None]:
    names = {"consul_kvs_apply": "kv", "consul_raft_leader_lastContact": "contact"}
    found: dict[str, float | None] = {"kv": None, "contact": None}
    if fmt == "prometheus":
        text = call("read agent metrics", lambda: client.agent.metrics(format_prometheus=True))
        if isinstance(text, bytes):
            text = text.decode()
        if not (text or "").strip():
            raise unavailable("agent metrics in prometheus format are empty: set telemetry.prometheus_retention_time "
                              "or use metrics_format=json", retryable=False)
        for family in text_string_to_metric_families(text):
            if family.name in names:
                for sample in family.samples:
                    if sample.labels.get("quantile") == "0.5" and not math.isnan(sample.value):
                        found[names[family.name]] = round(float(sample.value), 3)
        return found
    data = call("read agent metrics", lambda: client.agent.metrics())
    dotted = {"consul.kvs.apply": "kv", "consul.raft.leader.lastContact": "contact"}
    for sample in data.get("Samples") or []:
        if sample.get("Name") in dotted and sample.get("Count"):
            found[dotted[sample["Name"]]] = round(float(sample["Mean"]), 3)
    return found


@action("consul.health", timeout=60, retry=RetryDefaults(max_attempts=3))
def health(inp: HealthInput) -> HealthOutput:
    """Per server reachable or not; leader, voters, autopilot health, KV apply p50 and leader last contact.

    A server that does not answer is reported (with its error), not raised: during a recovery that is
    the case that matters. Cluster reads come from the servers that answer; only none answering fails.
    """
    token = consul_token(inp.consul)
    servers = _probe_servers(inp.consul, token)
    up = [r for r in servers if r.reachable]
    problems = [f"server {r.url} unreachable: {r.error}" for r in servers if not r.reachable]
    leader_addr = _from_any(inp.consul, token, up, "read leader", lambda c: c.status.leader(), problems) or None
    config = _from_any(inp.consul, token, up, "read raft configuration",
                       lambda c: consul_get(c, "/v1/operator/raft/configuration"), problems) or {}
    raft = config.get("Servers") or []
    leader = next((s for s in raft if s.get("Leader")), None)
    autopilot = _from_any(inp.consul, token, up, "read autopilot health",
                          lambda c: c.operator.autopilot_health(), problems) or {}
    on_leader = next((r for r in up if r.leader), None)
    source = on_leader or up[0]
    try:
        p50 = _metric_p50s(consul_client(inp.consul, source.url, token=token or ""), inp.metrics_format)
    except ApplicationError as exc:
        if exc.non_retryable:
            raise
        problems.append(f"cannot read metrics at {source.url}: {exc}")
        p50 = {"kv": None, "contact": None}
    if leader is None or not leader_addr:
        problems.append("no known leader")
    if autopilot and not autopilot.get("Healthy"):
        bad_servers = [s.get("Name") for s in autopilot.get("Servers", []) if not s.get("Healthy")]
        problems.append(f"autopilot unhealthy: {', '.join(map(str, bad_servers)) or 'cluster'}")
    if on_leader is None:
        problems.append("leader's agent not among the servers that answered: metrics are a follower's")
    if p50["kv"] is not None and p50["kv"] > inp.max_kv_apply_p50_ms:
        problems.append(f"KV apply p50 {p50['kv']:.0f} ms > {inp.max_kv_apply_p50_ms:.0f} ms")
    if p50["contact"] is not None and p50["contact"] > inp.max_leader_contact_ms:
        problems.append(f"leader last contact p50 {p50['contact']:.0f} ms > {inp.max_leader_contact_ms:.0f} ms")
    return HealthOutput(
        leader=leader.get("Node") if leader else None, leader_address=leader_addr,
        leader_id=leader.get("ID") if leader else None,
        voters=[s["Node"] for s in raft if s.get("Voter")],
        autopilot_healthy=bool(autopilot.get("Healthy")),
        failure_tolerance=int(autopilot.get("FailureTolerance") or 0),
        kv_apply_p50_ms=p50["kv"], leader_last_contact_ms=p50["contact"],
        metrics_node=source.node, metrics_from_leader=on_leader is not None, metrics_format=inp.metrics_format,
        servers=servers, unreachable=[r.url for r in servers if not r.reachable],
        healthy=not problems, problems=problems)


class LeaderTransferInput(BaseModel):
    consul: ConsulTarget
    slow_servers: list[str] = Field(min_length=1, description="node names or raft IDs of servers that must not lead")
    verify_timeout_seconds: float = Field(default=30.0, gt=0, le=600)


class LeaderTransferOutput(BaseModel):
    changed: bool
    previous_leader: str
    leader: str
    target: str | None
    reason: str


def _raft_servers(client: consul.Consul) -> list[dict[str, Any]]:
    return call("read raft configuration",
                lambda: consul_get(client, "/v1/operator/raft/configuration")).get("Servers") or []


@action("consul.leader.transfer", timeout=120, mutating=True, retry=RetryDefaults(max_attempts=4))
def leader_transfer(inp: LeaderTransferInput) -> LeaderTransferOutput:
    """Move raft leadership off servers marked slow to a healthy voter; nothing to do if the leader is not slow."""
    client = consul_client(inp.consul)
    servers = _raft_servers(client)
    by_ref = {s["Node"]: s for s in servers} | {s["ID"]: s for s in servers}
    unknown = [ref for ref in inp.slow_servers if ref not in by_ref]
    if unknown:
        raise bad(f"slow_servers not in the raft configuration: {unknown} (have {sorted(s['Node'] for s in servers)})")
    slow = {by_ref[ref]["ID"] for ref in inp.slow_servers}
    leader = next((s for s in servers if s.get("Leader")), None)
    if leader is None:
        raise unavailable("no raft leader right now; try again once one is elected")
    if leader["ID"] not in slow:
        return LeaderTransferOutput(changed=False, previous_leader=leader["Node"], leader=leader["Node"], target=None,
                                    reason="leader is not among the slow servers")
    autopilot = call("read autopilot health", lambda: client.operator.autopilot_health())
    healthy = {s["ID"] for s in autopilot.get("Servers", []) if s.get("Healthy")}
    candidates = [s for s in servers if s.get("Voter") and s["ID"] not in slow and not s.get("Leader")]
    # Prefer voters autopilot calls healthy; an unhealthy-but-fast voter still beats a slow leader.
    candidates.sort(key=lambda s: (s["ID"] not in healthy, s["Node"]))
    if not candidates:
        raise ApplicationError("every voter is marked slow: nowhere to move leadership", type="NoTarget",
                               non_retryable=True)
    target = candidates[0]
    call("transfer leadership", lambda: client.operator.raft_transfer_leader(target["ID"]))
    deadline = time.monotonic() + inp.verify_timeout_seconds
    while True:
        now_leader = next((s for s in _raft_servers(client) if s.get("Leader")), None)
        if now_leader is not None and now_leader["ID"] != leader["ID"]:
            if now_leader["ID"] in slow:
                # Raft chose differently (e.g. the target lagged); a retry moves it again.
                raise unavailable(f"leadership moved to {now_leader['Node']}, which is also slow")
            return LeaderTransferOutput(changed=True, previous_leader=leader["Node"], leader=now_leader["Node"],
                                        target=target["Node"], reason="leader was marked slow")
        if time.monotonic() > deadline:
            raise unavailable(f"asked raft to move leadership from {leader['Node']} to {target['Node']}, but the "
                              f"leader had not changed after {inp.verify_timeout_seconds:.0f}s")
        heartbeat({"waiting_for": target["Node"]})
        time.sleep(0.2)


# =========================================================================== KV actions


class KvSetInput(BaseModel):
    """Set a key (text or base64 bytes) or delete it; expect_index refuses to clobber a newer write."""

    consul: ConsulTarget
    key: str
    value: str | None = None
    value_base64: str | None = None
    delete: bool = Field(default=False, description="make the key absent instead")
    flags: int = Field(default=0, ge=0)
    expect_index: int | None = Field(default=None, ge=0, description="only act if the key's ModifyIndex is this "
                                     "(0 = only if absent)")

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        return _check_key(key)

    @model_validator(mode="after")
    def _one_value(self) -> "KvSetInput":
        given = (self.value is not None) + (self.value_base64 is not None)
        if self.delete and given:
            raise ValueError("delete takes no value")
        if not self.delete and given != 1:
            raise ValueError("give exactly one of value or value_base64 (or delete: true)")
        if self.value_base64 is not None:
            try:
                base64.b64decode(self.value_base64, validate=True)
            except ValueError:
                raise ValueError("value_base64 is not valid base64") from None
        return self

    def desired(self) -> bytes | _Absent:
        if self.delete:
            return ABSENT
        if self.value_base64 is not None:
            return base64.b64decode(self.value_base64)
        return (self.value or "").encode()


class KvSetOutput(BaseModel):
    key: str
    changed: bool
    previous: KvEntry | None = Field(description="the key before (None = it did not exist)")
    previous_value: str | None = Field(description="previous value as text, for humans")
    modify_index: int
    undo: KvSetInput


def _kv_set(inp: KvSetInput, client: consul.Consul | None = None) -> KvSetOutput:
    client = client or consul_client(inp.consul)
    previous, changed, index = kv_ensure(client, inp.key, inp.desired(), inp.flags, inp.expect_index)
    undo = _undo_for(inp.consul, inp.key, previous, index if changed else None)
    return KvSetOutput(key=inp.key, changed=changed, previous=previous, previous_value=_text(previous),
                       modify_index=index, undo=undo)


def _undo_for(target: ConsulTarget, key: str, previous: KvEntry | None, index: int | None) -> KvSetInput:
    if previous is None:
        return KvSetInput(consul=target, key=key, delete=True, expect_index=index)
    return KvSetInput(consul=target, key=key, value_base64=previous.value_base64 or "", flags=previous.flags,
                      expect_index=index)


@action("consul.kv.set", timeout=60, mutating=True, undo="consul.kv.set", undo_from_output="undo")
def kv_set(inp: KvSetInput) -> KvSetOutput:
    """Set (or delete) one KV key with check-and-set; the output holds the previous value for undo."""
    return _kv_set(inp)


class KvRestoreInput(BaseModel):
    consul: ConsulTarget
    entries: list[KvEntry] = Field(max_length=100_000)
    on_conflict: Literal["fail", "skip", "overwrite"] = Field(
        default="fail", description="a key that exists again with another value: fail before writing anything, "
                                    "leave it, or overwrite it")


class KvRestoreOutput(BaseModel):
    restored: list[str]
    unchanged: list[str]
    conflicts: list[str]


@action("consul.kv.restore", timeout=1800, heartbeat=60, mutating=True)
def kv_restore(inp: KvRestoreInput) -> KvRestoreOutput:
    """Put recorded keys back exactly (value and flags); the undo of consul.kv.delete_prefix."""
    client = consul_client(inp.consul)
    plan: list[tuple[KvEntry, int]] = []
    unchanged, conflicts = [], []
    for entry in inp.entries:
        _, cur = call(f"read KV {entry.key}", lambda: client.kv.get(entry.key))
        if cur is None:
            plan.append((entry, 0))
        elif (normalize(cur.get("Value")), int(cur.get("Flags") or 0)) == (entry.value_base64, entry.flags):
            unchanged.append(entry.key)
        else:
            conflicts.append(entry.key)
            if inp.on_conflict == "overwrite":
                plan.append((entry, int(cur["ModifyIndex"])))
    if conflicts and inp.on_conflict == "fail":
        raise ApplicationError(f"{len(conflicts)} key(s) exist again with other values, nothing written: "
                               f"{conflicts[:20]}", type="Conflict", non_retryable=True)
    restored = []
    for n, (entry, index) in enumerate(plan):
        kv_ensure(client, entry.key, entry.raw() or b"", entry.flags, expect_index=index)
        restored.append(entry.key)
        if n % 50 == 0:
            heartbeat({"restored": len(restored)})
    return KvRestoreOutput(restored=restored, unchanged=unchanged, conflicts=conflicts)


class KvDeletePrefixInput(BaseModel):
    consul: ConsulTarget
    prefix: str = Field(description="e.g. cache/scheduling/ (the empty prefix and '/' are refused)")
    max_keys: int = Field(default=10_000, ge=1, le=100_000, description="refuse (change nothing) above this")
    max_bytes: int = Field(default=1_000_000, ge=1, description="refuse above this many value bytes: the "
                           "deleted values travel in the output, and so in workflow history")

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, prefix: str) -> str:
        if prefix.strip("/") == "":
            raise ValueError("refusing to delete the whole KV store; give a real prefix")
        return _check_key(prefix)


class KvDeletePrefixOutput(BaseModel):
    prefix: str
    deleted: list[KvEntry]
    count: int
    undo: KvRestoreInput


@action("consul.kv.delete_prefix", timeout=1800, heartbeat=60, mutating=True, undo="consul.kv.restore",
        undo_from_output="undo")
def kv_delete_prefix(inp: KvDeletePrefixInput) -> KvDeletePrefixOutput:
    """Delete every key under a prefix, recording each (value, flags) so consul.kv.restore can put them back.

    Keys go one by one with check-and-set, so a key rewritten mid-way is re-read and its newest
    value is what gets recorded. A retried attempt resumes from the heartbeat's record of what
    it already deleted.
    """
    client = consul_client(inp.consul)
    details = resume_details()
    deleted: dict[str, KvEntry] = {}
    if isinstance(details, dict) and details.get("prefix") == inp.prefix:
        deleted = {e["key"]: KvEntry.model_validate(e) for e in details.get("deleted", [])}
    _, entries = _read_prefix(client, inp.prefix)
    size = sum(len(_entry(e).raw() or b"") for e in entries) + sum(len(e.raw() or b"") for e in deleted.values())
    if len(entries) + len(deleted) > inp.max_keys or size > inp.max_bytes:
        raise bad(f"{inp.prefix}: {len(entries)} keys / {size} bytes exceed max_keys={inp.max_keys} / "
                  f"max_bytes={inp.max_bytes}; nothing deleted")
    last_beat = time.monotonic()
    for raw in entries:
        key = raw["Key"]
        for _ in range(CAS_ATTEMPTS):
            if raw is None:
                break
            ok = call(f"delete KV {key}", lambda: client.kv.delete(key, cas=int(raw["ModifyIndex"])))
            if ok:
                deleted[key] = _entry(raw)
                break
            _, raw = call(f"read KV {key}", lambda: client.kv.get(key))  # rewritten meanwhile: record the newest
        else:
            raise unavailable(f"KV {key} kept changing while deleting; deleted so far: {len(deleted)}",
                              details=_delete_details(inp.prefix, deleted))
        if time.monotonic() - last_beat > 1.0:
            heartbeat(_delete_details(inp.prefix, deleted))
            last_beat = time.monotonic()
    heartbeat(_delete_details(inp.prefix, deleted))
    _, left = _read_prefix(client, inp.prefix)
    if left:
        raise unavailable(f"{inp.prefix}: {len(left)} key(s) appeared while deleting (writers still active?)",
                          details=_delete_details(inp.prefix, deleted))
    records = sorted(deleted.values(), key=lambda e: e.key)
    return KvDeletePrefixOutput(prefix=inp.prefix, deleted=records, count=len(records),
                                undo=KvRestoreInput(consul=inp.consul, entries=records))


def _delete_details(prefix: str, deleted: dict[str, KvEntry]) -> dict[str, Any]:
    return {"prefix": prefix, "deleted": [e.model_dump() for e in deleted.values()]}


class StreamingSetInput(BaseModel):
    consul: ConsulTarget
    enabled: bool
    key: str = Field(default=STREAMING_KEY, description="the flag's KV key (lab: coldstart/flags/streaming)")
    true_value: str = "true"
    false_value: str = "false"

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        return _check_key(key)


class StreamingSetOutput(BaseModel):
    key: str
    enabled: bool
    changed: bool
    previous_value: str | None = Field(description="None: the key did not exist")
    undo: KvSetInput


@action("consul.streaming.set", timeout=60, mutating=True, undo="consul.kv.set", undo_from_output="undo")
def streaming_set(inp: StreamingSetInput) -> StreamingSetOutput:
    """Turn the streaming feature flag on or off (a KV key); the output's undo puts the previous value back."""
    out = _kv_set(KvSetInput(consul=inp.consul, key=inp.key, value=inp.true_value if inp.enabled else inp.false_value))
    return StreamingSetOutput(key=inp.key, enabled=inp.enabled, changed=out.changed,
                              previous_value=out.previous_value, undo=out.undo)


# =========================================================================== non-essential usage


class UserService(BaseModel):
    """One service from the inventory's tiers, and who owns the health check stretched while it is disabled.

    check_owner names where the check is defined, because that is the only place it can be changed
    and read back exactly:

    - "nomad": a check in a `service` block (provider consul) of Nomad job `nomad_job`, group
      `nomad_group`: the block named `check_service` (default: `name`), the check named `check_name`
      (default: the block's only check). It is changed in the job spec, in the same job version as
      the scale-down; a change made on the agent would be reset by Nomad's service sync.
    - "agent": a check registered directly on a Consul agent (`check_agent`, default consul.address)
      as `check_id`, whose full registration body is `check_definition`: the agent's own answer
      (GET /v1/agent/checks) carries neither the target nor the headers nor the method.
    - None: no check is changed.
    """

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    tier: str = ""
    essential: bool = False
    usage_flag_key: str | None = Field(default=None, description="KV key that turns the service's Consul usage on")
    nomad_job: str | None = Field(default=None, description="Nomad job running the service (scaled down)")
    nomad_group: str | None = Field(default=None, description="task group; default the job's only group")
    nomad_namespace: str = "default"
    check_owner: Literal["nomad", "agent"] | None = Field(
        default=None, description="who defines the check to stretch: nomad (the job's service block), agent "
                                  "(registered on an agent from check_definition), or none")
    check_service: str | None = Field(default=None, description="nomad: the service block's name; default name")
    check_name: str | None = Field(default=None, description="nomad: the check's name; default the block's only one")
    check_id: str | None = Field(default=None, description="agent: the check's ID on the agent")
    check_agent: str | None = Field(default=None, description="agent: the agent's URL; default consul.address")
    check_definition: dict[str, Any] | None = Field(
        default=None, description="agent: the check exactly as registered (PUT /v1/agent/check/register body "
                                  "without its ID), Interval included; what consul.user.enable puts back")

    @field_validator("usage_flag_key")
    @classmethod
    def _flag(cls, key: str | None) -> str | None:
        return None if key is None else _check_key(key)

    @model_validator(mode="after")
    def _owner(self) -> "UserService":
        nomad_fields = [n for n in ("check_service", "check_name") if getattr(self, n) is not None]
        agent_fields = [n for n in ("check_id", "check_agent", "check_definition") if getattr(self, n) is not None]
        if self.check_owner != "nomad" and nomad_fields:
            raise ValueError(f"{nomad_fields} only apply with check_owner: nomad")
        if self.check_owner != "agent" and agent_fields:
            raise ValueError(f"{agent_fields} only apply with check_owner: agent")
        if self.check_owner == "nomad" and not self.nomad_job:
            raise ValueError("check_owner nomad needs nomad_job (the job whose service block defines the check)")
        if self.check_owner == "agent":
            if not (self.check_id and self.check_definition):
                raise ValueError("check_owner agent needs check_id and check_definition")
            if {k.lower() for k in self.check_definition} & {"id", "checkid"}:
                raise ValueError("check_definition carries no ID: give it as check_id")
            if _ci(self.check_definition, "TTL") or not _ci(self.check_definition, "Interval"):
                raise ValueError("check_definition needs an Interval (a TTL check has none to stretch)")
            go_duration_seconds(_ci(self.check_definition, "Interval"))
            if not _ci(self.check_definition, "Name"):
                raise ValueError("check_definition needs the check's Name (the agent requires one)")
        return self


class FlagRecord(BaseModel):
    key: str
    previous: KvEntry | None = Field(description="None: the key did not exist")


class NomadCheckRecord(BaseModel):
    """A check as the Nomad job defined it before it was stretched."""

    owner: Literal["nomad"] = "nomad"
    job: str
    namespace: str
    place: CheckPlace
    interval: str = Field(description="the original interval, for humans (the definition holds it exactly)")
    definition: dict[str, Any] = Field(description="the check object exactly as the job spec had it")


class AgentCheckRecord(BaseModel):
    """A check registered on an agent, with the definition it is registered from."""

    owner: Literal["agent"] = "agent"
    agent: str
    check_id: str
    interval: str
    definition: dict[str, Any] = Field(description="the registration body from the inventory (without ID)")


class ScaleRecord(BaseModel):
    job: str
    group: str
    namespace: str
    count: int


class ServiceRecord(BaseModel):
    """What one service looked like before consul.user.disable touched it."""

    name: str
    tier: str = ""
    flag: FlagRecord | None = None
    check: Annotated[NomadCheckRecord | AgentCheckRecord, Field(discriminator="owner")] | None = None
    scale: ScaleRecord | None = None
    notes: list[str] = Field(default_factory=list)


class _Shared(BaseModel):
    consul: ConsulTarget
    nomad: NomadTarget | None = Field(default=None, description="needed when services name a Nomad job")
    journal_prefix: str | None = Field(
        default=JOURNAL_PREFIX,
        description="KV prefix recording each service's original state before it is changed, so a crash or a "
                    "second disable never records the disabled state as the original; null = no journal")


class _DisableKnobs(BaseModel):
    disabled_value: str = Field(default="disabled", description="what the usage flag is set to")
    check_interval: str = Field(default="10m", description="the stretched health-check interval")
    scale_to: int = Field(default=1, ge=0, description="task group count while disabled (never scales up)")

    @field_validator("check_interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        if go_duration_seconds(value) <= 0:
            raise ValueError("check_interval must be > 0")
        return value


class UserEnableInput(_Shared):
    record: ServiceRecord
    tiers: list[str] | None = Field(default=None, description="only re-enable services of these tiers (the rest "
                                                             "are left for a later step); default every tier")


class UserDisableInput(_Shared, _DisableKnobs):
    service: UserService


class UserDisableOutput(BaseModel):
    service: str
    skipped: str | None = Field(default=None, description="why nothing was done (essential service)")
    changed: list[str] = Field(description="what this call changed: flag, check, scale")
    record: ServiceRecord | None
    restore: UserEnableInput = Field(description="the input for consul.user.enable (a no-op for essential services)")


class UserEnableOutput(BaseModel):
    service: str
    changed: list[str]
    notes: list[str] = Field(default_factory=list)


def _ci(data: dict[str, Any], name: str) -> Any:
    want = name.lower().replace("_", "")
    return next((v for k, v in data.items() if k.lower().replace("_", "") == want), None)


def _nanoseconds(interval: str) -> int:
    return int(round(go_duration_seconds(interval) * 1e9))


def _duration_text(nanoseconds: int) -> str:
    for unit, size in (("h", 3600 * 10**9), ("m", 60 * 10**9), ("s", 10**9), ("ms", 10**6)):
        if nanoseconds and nanoseconds % size == 0:
            return f"{nanoseconds // size}{unit}"
    return f"{nanoseconds}ns"


def _seconds(value: Any) -> float:
    """An agent-reported or definition duration in seconds; unset ("" or None) is 0."""
    return 0.0 if value in (None, "") else go_duration_seconds(value)


# --------------------------------------------------------------------------- checks registered on an agent


def _agent_client(inp: _Shared, client: consul.Consul, agent: str) -> consul.Consul:
    return client if agent == inp.consul.address else consul_client(inp.consul, agent, token=client.token or "")


def _read_agent_check(client: consul.Consul, agent: str, check_id: str) -> dict[str, Any]:
    checks = call(f"list agent checks on {agent}", lambda: client.agent.checks())
    chk = checks.get(check_id)
    if chk is None:
        raise ApplicationError(f"check {check_id!r} is not registered on agent {agent}", type="NotFound",
                               non_retryable=True)
    return chk


def _with_interval(definition: dict[str, Any], interval: str) -> dict[str, Any]:
    key = next(k for k in definition if k.lower() == "interval")
    return {**definition, key: interval}


def _agent_matches(live: dict[str, Any], body: dict[str, Any]) -> bool:
    """Does the agent's check show what `body` registers? (Interval, Timeout, Name, ServiceID, Notes: all the
    agent reports of a definition.)"""
    return (_seconds(live.get("Interval")) == _seconds(_ci(body, "Interval"))
            and _seconds(live.get("Timeout")) == _seconds(_ci(body, "Timeout"))
            and live.get("Name") == (_ci(body, "Name") or live.get("Name"))
            and live.get("ServiceID", "") == (_ci(body, "ServiceID") or "")
            and live.get("Notes", "") == (_ci(body, "Notes") or ""))


def _observe_agent_check(inp: UserDisableInput, client: consul.Consul) -> AgentCheckRecord:
    svc = inp.service
    agent = svc.check_agent or inp.consul.address
    live = _read_agent_check(_agent_client(inp, client, agent), agent, svc.check_id)
    want = str(_ci(svc.check_definition, "Interval"))
    have = live.get("Interval")
    if _seconds(have) not in (_seconds(want), _seconds(inp.check_interval)):
        raise ApplicationError(
            f"check {svc.check_id} on {agent} runs every {have or 'never'}, but the inventory's check_definition "
            f"says {want}: the inventory is out of date; not re-registering the check from it",
            type="Conflict", non_retryable=True)
    return AgentCheckRecord(agent=agent, check_id=svc.check_id, interval=want, definition=svc.check_definition)


def _ensure_agent_check(inp: _Shared, client: consul.Consul, rec: AgentCheckRecord, interval: str,
                        changed: list[str]) -> None:
    """Register the recorded definition with `interval` unless the agent already shows it; read back.
    "check" goes into `changed` as soon as the agent took the registration."""
    agent_client = _agent_client(inp, client, rec.agent)
    body = {**_with_interval(rec.definition, interval), "ID": rec.check_id}
    if _agent_matches(_read_agent_check(agent_client, rec.agent, rec.check_id), body):
        return
    # The agent keeps the check's status and output across a re-registration of the same ID.
    ok = call(f"register check {rec.check_id} on {rec.agent}", lambda: agent_client.http.put(
        CB.boolean(), "/v1/agent/check/register", headers=agent_client.prepare_headers(), data=json.dumps(body)))
    if not ok:
        raise unavailable(f"agent {rec.agent} refused to register check {rec.check_id}")
    changed.append("check")
    after = _read_agent_check(agent_client, rec.agent, rec.check_id)
    if not _agent_matches(after, body):
        raise unavailable(f"registered check {rec.check_id} on {rec.agent} every {interval}, but it reads back "
                          f"every {after.get('Interval')!r}")


# --------------------------------------------------------------------------- the Nomad job: check and count


def _live_check(spec: dict[str, Any], rec: NomadCheckRecord) -> dict[str, Any]:
    """The recorded check in `spec`, refusing when it is gone or was changed since beyond what we stretch."""
    chk = check_at(spec, rec.place)
    where = f"check {rec.place.check!r} of service {rec.place.service!r} in job {rec.job}"
    if chk is None:
        raise ApplicationError(f"{where} is gone since it was recorded; not touching the job", type="Conflict",
                               non_retryable=True)
    moved = differing(chk, rec.definition)
    if moved:
        raise ApplicationError(f"{where} changed since it was recorded ({', '.join(moved)}); not overwriting it",
                               type="Conflict", non_retryable=True)
    return chk


def _job_group(spec: dict[str, Any], scale: ScaleRecord) -> dict[str, Any]:
    tg = next((g for g in spec.get("TaskGroups") or [] if g["Name"] == scale.group), None)
    if tg is None:
        raise ApplicationError(f"job {scale.job} has no task group {scale.group!r} any more; not touching it",
                               type="Conflict", non_retryable=True)
    return tg


def _check_status(client: consul.Consul, rec: NomadCheckRecord) -> str | None:
    """The worst state Consul holds for this check across the service's instances (None: none registered)."""
    _, checks = call(f"read health checks of {rec.place.service}", lambda: client.health.checks(rec.place.service))
    return worst_status([c.get("Status", "") for c in checks or [] if c.get("Name") == rec.place.check])


def _apply_to_job(api: Any, scale: ScaleRecord, plan: Any, changed: list[str]) -> None:
    """One update_job with `plan(spec) -> [what it changed]` (editing spec); update_job reads the job back and
    asks `plan` again, which must then find nothing to do. What landed goes into `changed`, also when
    update_job fails after its register (then told from the job as it reads now)."""
    from activities.nomad import update_job

    if not plan(read_job(api, scale.job, scale.namespace)):
        return  # already as wanted: no need to wait out a deployment to find that out
    planned: list[list[str]] = []

    def mutate(spec: dict[str, Any]) -> bool:
        found = plan(spec)
        if found:
            planned.append(found)
        return bool(found)

    try:
        _, did = update_job(api, scale.job, scale.namespace, mutate)
    except Exception:
        if planned:
            try:
                remaining = plan(read_job(api, scale.job, scale.namespace))
            except Exception:  # noqa: BLE001 - cannot tell: count the planned change as made
                remaining = []
            changed += [what for what in planned[-1] if what not in remaining]
        raise
    changed += planned[-1] if did else []


def _disable_job(inp: UserDisableInput, client: consul.Consul, api: Any, rec: ServiceRecord,
                 changed: list[str]) -> None:
    """Stretch the job's check and scale it down in ONE job version (each register starts a deployment).
    Only Interval, InitialStatus and OnUpdate of the check change (STRETCHED_FIELDS)."""
    scale = rec.scale
    check = rec.check if isinstance(rec.check, NomadCheckRecord) else None
    want = _nanoseconds(inp.check_interval)

    def plan(spec: dict[str, Any]) -> list[str]:
        changes = []
        tg = _job_group(spec, scale)
        if check is not None:
            chk = _live_check(spec, check)
            if chk.get("Interval") != want:
                # A changed check is a new one to Consul: critical until its first run, which the agent
                # staggers anywhere within the interval. So it starts in the state it has now (read after
                # update_job waited out a deployment), and the deployment of this version does not wait on
                # it (on_update = ignore): it would otherwise fail, or roll back where auto_revert is on.
                status = _check_status(client, check)
                chk["Interval"] = want
                chk["OnUpdate"] = "ignore"
                if status is not None:
                    chk["InitialStatus"] = status
                changes.append("check")
        if int(tg.get("Count") or 0) > inp.scale_to:
            tg["Count"] = inp.scale_to
            changes.append("scale")
        return changes

    _apply_to_job(api, scale, plan, changed)


def _enable_job(api: Any, rec: ServiceRecord, changed: list[str]) -> None:
    """Put the recorded check (every field) and count back in ONE job version."""
    scale = rec.scale
    check = rec.check if isinstance(rec.check, NomadCheckRecord) else None

    def plan(spec: dict[str, Any]) -> list[str]:
        changes = []
        tg = _job_group(spec, scale)
        if check is not None:
            chk = _live_check(spec, check)
            if chk != check.definition:
                chk.clear()
                chk.update(copy.deepcopy(check.definition))
                changes.append("check")
        if int(tg.get("Count") or 0) != scale.count:
            tg["Count"] = scale.count
            changes.append("scale")
        return changes

    _apply_to_job(api, scale, plan, changed)


# --------------------------------------------------------------------------- one service


def _journal_key(prefix: str, name: str) -> str:
    return f"{prefix.rstrip('/')}/{name}"


def _observe(inp: UserDisableInput, client: consul.Consul, nomad_api: Any) -> ServiceRecord:
    svc = inp.service
    record = ServiceRecord(name=svc.name, tier=svc.tier)
    if svc.usage_flag_key:
        _, cur = call(f"read KV {svc.usage_flag_key}", lambda: client.kv.get(svc.usage_flag_key))
        record.flag = FlagRecord(key=svc.usage_flag_key, previous=_entry(cur) if cur else None)
    if svc.check_owner == "agent":
        record.check = _observe_agent_check(inp, client)
    if svc.nomad_job:
        spec = read_job(nomad_api, svc.nomad_job, svc.nomad_namespace)
        tg = group_of(spec, svc.nomad_group)
        record.scale = ScaleRecord(job=svc.nomad_job, group=tg["Name"], namespace=svc.nomad_namespace,
                                   count=int(tg.get("Count") or 0))
        if svc.check_owner == "nomad":
            place = find_check(spec, tg["Name"], svc.check_service or svc.name, svc.check_name)
            definition = copy.deepcopy(check_at(spec, place))
            if not definition.get("Interval"):
                record.notes.append(f"check {place.check!r} of job {svc.nomad_job} has no interval: left alone")
            else:
                record.check = NomadCheckRecord(job=svc.nomad_job, namespace=svc.nomad_namespace, place=place,
                                                interval=_duration_text(int(definition["Interval"])),
                                                definition=definition)
    return record


def _record(inp: UserDisableInput, client: consul.Consul, nomad_api: Any) -> ServiceRecord:
    """The service's original state: from the journal if an earlier attempt wrote it, else observed now."""
    if inp.journal_prefix is None:
        return _observe(inp, client, nomad_api)
    key = _journal_key(inp.journal_prefix, inp.service.name)
    for _ in range(CAS_ATTEMPTS):
        _, cur = call(f"read journal {key}", lambda: client.kv.get(key))
        if cur is not None and cur.get("Value"):
            return ServiceRecord.model_validate_json(cur["Value"])
        record = _observe(inp, client, nomad_api)
        if call(f"write journal {key}", lambda: client.kv.put(key, record.model_dump_json(), cas=0)):
            return record
    raise unavailable(f"could not create journal entry {key}")


def _partial(action_name: str, name: str, changed: list[str], exc: BaseException,
             details: dict[str, Any]) -> ApplicationError:
    """An error that says exactly what this call changed before it failed; details carry the way back."""
    done = f"changed {', '.join(changed)}" if changed else "changed nothing"
    cause = str(exc) if isinstance(exc, ApplicationError) else describe(exc)
    kind = (exc.type if isinstance(exc, ApplicationError) else None) or "Unavailable"
    return ApplicationError(f"{action_name} {name}: {done}, then failed: {cause}",
                            {"service": name, "changed": changed, **details}, type=kind,
                            non_retryable=isinstance(exc, ApplicationError) and exc.non_retryable)


def _disable_one(inp: UserDisableInput, client: consul.Consul, nomad_api: Any) -> UserDisableOutput:
    svc = inp.service
    if svc.essential:
        noop = UserEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=None,
                               record=ServiceRecord(name=svc.name, notes=["essential: left untouched"]))
        return UserDisableOutput(service=svc.name, skipped="essential", changed=[], record=None, restore=noop)
    if svc.nomad_job and nomad_api is None:
        raise bad(f"service {svc.name} names Nomad job {svc.nomad_job} but no nomad target was given")
    record = _record(inp, client, nomad_api)
    restore = UserEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=inp.journal_prefix, record=record)
    changed: list[str] = []
    try:
        if record.flag is not None:
            _, did, _ = kv_ensure(client, record.flag.key, inp.disabled_value.encode(),
                                  record.flag.previous.flags if record.flag.previous else 0)
            changed += ["flag"] if did else []
        if isinstance(record.check, AgentCheckRecord):
            _ensure_agent_check(inp, client, record.check, inp.check_interval, changed)
        if record.scale is not None:
            _disable_job(inp, client, nomad_api, record, changed)
    except Exception as exc:  # noqa: BLE001 - whatever failed, say what had changed and how to undo it
        raise _partial("consul.user.disable", svc.name, changed, exc, {
            "record": record.model_dump(mode="json"), "restore": restore.model_dump(mode="json")}) from None
    return UserDisableOutput(service=svc.name, changed=changed, record=record, restore=restore)


def _enable_one(inp: UserEnableInput, client: consul.Consul, nomad_api: Any) -> UserEnableOutput:
    rec = inp.record
    if inp.tiers is not None and rec.tier not in inp.tiers:
        return UserEnableOutput(service=rec.name, changed=[], notes=[f"tier {rec.tier!r} not in {inp.tiers}: later"])
    if rec.scale is not None and nomad_api is None:
        raise bad(f"record for {rec.name} has a Nomad job but no nomad target was given")
    changed: list[str] = []
    try:
        if rec.flag is not None:
            _, did, _ = kv_ensure(client, rec.flag.key, _want(rec.flag.previous),
                                  rec.flag.previous.flags if rec.flag.previous else 0)
            changed += ["flag"] if did else []
        if isinstance(rec.check, AgentCheckRecord):
            _ensure_agent_check(inp, client, rec.check, rec.check.interval, changed)
        if rec.scale is not None:
            _enable_job(nomad_api, rec, changed)
        if inp.journal_prefix is not None:
            # Only now: until everything is back, the journal still holds the original for a retry.
            kv_ensure(client, _journal_key(inp.journal_prefix, rec.name), ABSENT)
    except Exception as exc:  # noqa: BLE001 - whatever failed, say what had been restored
        raise _partial("consul.user.enable", rec.name, changed, exc, {}) from None
    return UserEnableOutput(service=rec.name, changed=changed, notes=rec.notes)


def _clients(shared: _Shared) -> tuple[consul.Consul, Any]:
    return consul_client(shared.consul), nomad_client(shared.nomad) if shared.nomad else None


@action("consul.user.disable", timeout=900, heartbeat=60, mutating=True, undo="consul.user.enable",
        undo_from_output="restore")
def user_disable(inp: UserDisableInput) -> UserDisableOutput:
    """Cut one non-essential service's Consul usage: flag off, health check every 10 min, job scaled down.

    The check is changed where its owner defines it (the Nomad job's service block, or the agent from
    the inventory's definition); the check and the count change in one job version. On a failure the
    error's details hold what changed and `restore`, the consul.user.enable input that undoes it.
    """
    client, nomad_api = _clients(inp)
    return _disable_one(inp, client, nomad_api)


@action("consul.user.enable", timeout=900, heartbeat=60, mutating=True)
def user_enable(inp: UserEnableInput) -> UserEnableOutput:
    """Restore one service exactly as consul.user.disable recorded it (flag, every check field, job count)."""
    client, nomad_api = _clients(inp)
    return _enable_one(inp, client, nomad_api)


class UsersDisableInput(_Shared, _DisableKnobs):
    services: list[UserService] = Field(min_length=1, max_length=20_000)
    max_parallel: int = Field(default=8, ge=1, le=64)

    @field_validator("services")
    @classmethod
    def _unique(cls, services: list[UserService]) -> list[UserService]:
        names = [s.name for s in services]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate service names: {dupes[:20]}")
        return services


class UsersEnableInput(_Shared):
    records: list[ServiceRecord] = Field(max_length=20_000)
    max_parallel: int = Field(default=8, ge=1, le=64)


class UsersDisableOutput(BaseModel):
    disabled: list[str] = Field(description="non-essential services now disabled")
    changed: dict[str, list[str]] = Field(description="per service, what this call changed (flag, check, scale); "
                                                      "services it changed nothing on are absent")
    skipped_essential: list[str]
    restore: UsersEnableInput


class UsersEnableOutput(BaseModel):
    enabled: list[str]
    changed: dict[str, list[str]] = Field(description="per service, what this call restored")


def _fan_out(name: str, items: list[Any], one: Any, max_parallel: int
             ) -> tuple[list[Any], dict[str, ApplicationError], bool]:
    """Run one(item) on a bounded pool, heartbeating progress from this (the activity's) thread, also while a
    slow item (a job waiting out a deployment) keeps the others from finishing."""
    results: list[Any] = []
    failures: dict[str, ApplicationError] = {}
    with ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix=name) as pool:
        pending = {pool.submit(one, item): item for item in items}
        while pending:
            done, _ = wait(pending, timeout=20, return_when=FIRST_COMPLETED)
            for fut in done:
                label = getattr(pending.pop(fut), "name", "?")
                try:
                    results.append(fut.result())
                except ApplicationError as exc:
                    failures[label] = exc
                except Exception as exc:  # noqa: BLE001 - one service's surprise must not hide the others
                    failures[label] = unavailable(describe(exc))
            heartbeat({"done": len(items) - len(pending), "of": len(items)})
    return results, failures, all(not exc.non_retryable for exc in failures.values())


def _partial_details(exc: ApplicationError) -> dict[str, Any]:
    details = exc.details[0] if exc.details else None
    return details if isinstance(details, dict) else {}


def _changes_text(changed: dict[str, list[str]]) -> str:
    if not changed:
        return "nothing"
    shown = [f"{name} ({', '.join(what)})" for name, what in sorted(changed.items())[:10]]
    return ", ".join(shown) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")


@action("consul.users.disable", timeout=3 * 3600, heartbeat=120, mutating=True, undo="consul.users.enable",
        undo_from_output="restore")
def users_disable(inp: UsersDisableInput) -> UsersDisableOutput:
    """Disable every non-essential service's Consul usage; for 1,000s prefer for_each over consul.user.disable.

    Safe to retry: every service's original state is journaled in KV before it is changed. When some
    services fail, the error says per service what changed, and its details' `restore` brings back
    every service this call recorded, the failed ones' partial changes included.
    """
    token = consul_token(inp.consul)
    nomad_token = secret_of(inp.nomad.token) if inp.nomad is not None else None
    knobs = inp.model_dump(include={"disabled_value", "check_interval", "scale_to", "journal_prefix"})

    def one(svc: UserService) -> UserDisableOutput:
        client = consul_client(inp.consul, token=token or "")
        api = nomad_client(inp.nomad, token=nomad_token or "") if inp.nomad else None
        sub = UserDisableInput(consul=inp.consul, nomad=inp.nomad, service=svc, **knobs)
        return _disable_one(sub, client, api)

    results, failures, retryable = _fan_out("users-disable", inp.services, one, inp.max_parallel)
    partial = {name: _partial_details(exc) for name, exc in failures.items()}
    records = [r.record for r in results if r.record is not None]
    records += [ServiceRecord.model_validate(p["record"]) for p in partial.values() if p.get("record")]
    order = {s.name: i for i, s in enumerate(inp.services)}
    records.sort(key=lambda r: order[r.name])
    restore = UsersEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=inp.journal_prefix,
                               records=records, max_parallel=inp.max_parallel)
    changed = {r.service: r.changed for r in results if r.changed}
    changed |= {name: p["changed"] for name, p in partial.items() if p.get("changed")}
    if failures:
        raise ApplicationError(
            f"consul.users.disable: {len(failures)} of {len(inp.services)} service(s) failed; changed "
            f"{_changes_text(changed)}; details.restore brings back all {len(records)} recorded: "
            + "; ".join(f"{k}: {v}" for k, v in sorted(failures.items())[:10]),
            {"failed": {k: str(v) for k, v in failures.items()}, "changed": changed,
             "restore": restore.model_dump(mode="json")},
            type="PartialFailure", non_retryable=not retryable)
    return UsersDisableOutput(disabled=[r.service for r in results if r.skipped is None], changed=changed,
                              skipped_essential=[r.service for r in results if r.skipped], restore=restore)


@action("consul.users.enable", timeout=3 * 3600, heartbeat=120, mutating=True)
def users_enable(inp: UsersEnableInput) -> UsersEnableOutput:
    """Restore every recorded service exactly as consul.users.disable found it."""
    token = consul_token(inp.consul)
    nomad_token = secret_of(inp.nomad.token) if inp.nomad is not None else None

    def one(rec: ServiceRecord) -> UserEnableOutput:
        client = consul_client(inp.consul, token=token or "")
        api = nomad_client(inp.nomad, token=nomad_token or "") if inp.nomad else None
        sub = UserEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=inp.journal_prefix, record=rec)
        return _enable_one(sub, client, api)

    results, failures, retryable = _fan_out("users-enable", inp.records, one, inp.max_parallel)
    changed = {r.service: r.changed for r in results if r.changed}
    changed |= {name: d["changed"] for name, exc in failures.items() if (d := _partial_details(exc)).get("changed")}
    if failures:
        raise ApplicationError(
            f"consul.users.enable: {len(failures)} of {len(inp.records)} service(s) failed; restored "
            f"{_changes_text(changed)}: " + "; ".join(f"{k}: {v}" for k, v in sorted(failures.items())[:10]),
            {"failed": {k: str(v) for k, v in failures.items()}, "changed": changed},
            type="PartialFailure", non_retryable=not retryable)
    return UsersEnableOutput(enabled=[r.service for r in results], changed=changed)
