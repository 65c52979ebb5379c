"""Consul KV actions: set a key, delete a prefix and restore it, each with its undo."""

from __future__ import annotations

import time
from typing import Any

import consul
from temporalio.exceptions import ApplicationError

from activities._clients import ConsulTarget, bad, call, consul_client, heartbeat, resume_details, unavailable
from activities.binding import implements
from activities.consul._kv import CAS_ATTEMPTS, _entry, _read_prefix, _text, kv_ensure
from activities.consul.archive import normalize
from activities.contracts.consul_kv import (
    KV_DELETE_PREFIX,
    KV_RESTORE,
    KV_SET,
    KvDeletePrefixInput,
    KvDeletePrefixOutput,
    KvEntry,
    KvRestoreInput,
    KvRestoreOutput,
    KvSetInput,
    KvSetOutput,
)

__all__ = ["kv_delete_prefix", "kv_restore", "kv_set", "kv_undo"]


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


@implements(KV_SET)
def kv_set(inp: KvSetInput) -> KvSetOutput:
    return _kv_set(inp)


@implements(KV_RESTORE)
def kv_restore(inp: KvRestoreInput) -> KvRestoreOutput:
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


@implements(KV_DELETE_PREFIX)
def kv_delete_prefix(inp: KvDeletePrefixInput) -> KvDeletePrefixOutput:
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
