"""Contracts of the Consul snapshot actions: save, select, preview and restore a snapshot of the cluster's state."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field, field_validator

from activities.contracts.model import ContractModel
from activities.contracts.targets import ConsulTarget
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "SNAPSHOT_PREVIEW",
    "SNAPSHOT_RESTORE",
    "SNAPSHOT_SAVE",
    "SNAPSHOT_SELECT",
    "SnapshotPreview",
    "SnapshotPreviewInput",
    "SnapshotRestoreInput",
    "SnapshotRestoreOutput",
    "SnapshotSaveInput",
    "SnapshotSaveOutput",
    "SnapshotSelectInput",
    "SnapshotSelectOutput",
]


class SnapshotSaveInput(ContractModel):
    consul: ConsulTarget
    directory: str = Field(description="directory to write the snapshot file into (created if missing)")
    prefix: str = Field(default="consul", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    stale: bool = Field(default=False, description="let any server answer (use when the leader is unhealthy)")


class SnapshotSaveOutput(ContractModel):
    path: str
    size: int
    sha256: str
    index: int
    snapshot_id: str
    taken_at: datetime
    reused: bool = Field(description="true when a retry of this step found its file already complete")


class SnapshotSelectInput(ContractModel):
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


class SnapshotSelectOutput(ContractModel):
    path: str
    taken_at: datetime
    age_seconds: float
    snapshot_id: str
    index: int
    considered: int
    unreadable: list[str]


class SnapshotPreviewInput(ContractModel):
    consul: ConsulTarget
    path: str = Field(description="snapshot archive to restore")
    max_keys: int = Field(default=50, ge=0, le=5000, description="cap on each listed key set")


class SnapshotPreview(ContractModel):
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


class SnapshotRestoreInput(ContractModel):
    consul: ConsulTarget
    path: str
    expect_sha256: str | None = Field(default=None, description="refuse unless the file still has this digest "
                                      "(pin the file the approval step previewed)")
    max_keys: int = Field(default=50, ge=0, le=5000)
    force: bool = Field(default=False, description="restore even when the KV already matches the snapshot")


class SnapshotRestoreOutput(ContractModel):
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


SNAPSHOT_SAVE = declare(
    "consul.snapshot.save", SnapshotSaveInput, SnapshotSaveOutput, timeout=1800, heartbeat=60, retry=Retry(max_attempts=3),
    doc="""Save a forensic copy of the cluster state (GET /v1/snapshot), streamed to a file with its sha256.""",
)


SNAPSHOT_SELECT = declare(
    "consul.snapshot.select", SnapshotSelectInput, SnapshotSelectOutput, timeout=300, retry=Retry(max_attempts=2),
    doc="""Pick the newest snapshot in a store taken before a time, dated by the archive's own raft metadata.

    The time comes from meta.json's ID ("<term>-<index>-<unix ms>", written by raft when the
    snapshot was taken), not the file's mtime or name: copies and rsyncs change mtimes, and
    names are whatever the tool that wrote them chose.
    """,
)


SNAPSHOT_PREVIEW = declare(
    "consul.snapshot.preview", SnapshotPreviewInput, SnapshotPreview, timeout=300, retry=Retry(max_attempts=3),
    doc="""Show what restoring a snapshot would change (age; KV keys added, removed, changed) without restoring.""",
)


SNAPSHOT_RESTORE = declare(
    "consul.snapshot.restore", SnapshotRestoreInput, SnapshotRestoreOutput, timeout=1800, heartbeat=120, mutating=True, retry=Retry(max_attempts=3),
    doc="""Reset the cluster to a snapshot (PUT /v1/snapshot); skipped when the KV already equals the snapshot's.

    The archive goes out with one extra KV entry, RESTORE_JOURNAL + this step's tag, so the restore and
    its record land together: a retry of the step that finds the entry does not PUT again (that would
    roll back whatever was written since) and verifies instead. No undo: take consul.snapshot.save first.
    """,
)
