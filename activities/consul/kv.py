"""Consul KV actions: set a key, delete a prefix and restore it, and the streaming flag, each with its undo."""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import consul
from pydantic import BaseModel, Field, field_validator, model_validator
from temporalio.exceptions import ApplicationError

from activities._clients import ConsulTarget, bad, call, consul_client, heartbeat, resume_details, unavailable
from activities.consul._kv import (
    ABSENT,
    CAS_ATTEMPTS,
    KvEntry,
    _Absent,
    _check_key,
    _entry,
    _read_prefix,
    _text,
    kv_ensure,
)
from activities.consul.archive import normalize
from activities.registry import action

__all__ = [
    "STREAMING_KEY",
    "KvDeletePrefixInput",
    "KvDeletePrefixOutput",
    "KvRestoreInput",
    "KvRestoreOutput",
    "KvSetInput",
    "KvSetOutput",
    "StreamingSetInput",
    "StreamingSetOutput",
    "kv_delete_prefix",
    "kv_restore",
    "kv_set",
    "kv_undo",
    "streaming_set",
]

STREAMING_KEY = "coldstart/flags/streaming"


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
    def _one_value(self) -> KvSetInput:
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
    undo = kv_undo(inp.consul, inp.key, previous, index if changed else None)
    return KvSetOutput(key=inp.key, changed=changed, previous=previous, previous_value=_text(previous),
                       modify_index=index, undo=undo)


def kv_undo(target: ConsulTarget, key: str, previous: KvEntry | None, index: int | None) -> KvSetInput:
    """The kv.set that puts `key` back as `previous`, only if it still has the ModifyIndex `index` we left."""
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
