"""The KV core the Consul actions share: one stored entry, and check-and-set writes that read back."""

from __future__ import annotations

from typing import Any

import consul
from temporalio.exceptions import ApplicationError

from activities._clients import call, unavailable
from activities.consul.archive import normalize
from activities.contracts.consul_kv import ABSENT, Absent, KvEntry

__all__ = ["CAS_ATTEMPTS", "kv_ensure"]

CAS_ATTEMPTS = 8


def _entry(raw: dict[str, Any]) -> KvEntry:
    # py-consul hands values back already base64-decoded.
    return KvEntry(key=raw["Key"], value_base64=normalize(raw.get("Value")), flags=int(raw.get("Flags") or 0))


def _text(entry: KvEntry | None) -> str | None:
    raw = entry.raw() if entry is not None else None
    return raw.decode("utf-8", errors="replace") if raw is not None else None


def kv_ensure(client: consul.Consul, key: str, want: bytes | None | Absent, flags: int = 0,
              expect_index: int | None = None, current: tuple[Any, dict[str, Any] | None] | None = None,
              ) -> tuple[KvEntry | None, bool, int]:
    """Make `key` hold `want` with check-and-set; returns (previous, changed, modify index after).

    expect_index guards undo steps: when the key no longer has the ModifyIndex we left it at,
    someone changed it since, and overwriting their value silently would be wrong.
    current: py-consul's (index, entry) for `key` as the caller just read it, saving the first read;
    the check-and-set still catches any write made since.
    """
    for _ in range(CAS_ATTEMPTS):
        if current is not None:
            (index, cur), current = current, None
        else:
            index, cur = call(f"read KV {key}", lambda: client.kv.get(key))
        previous = _entry(cur) if cur else None
        if isinstance(want, Absent):
            if cur is None:
                return previous, False, int(index or 0)
        elif cur is not None and normalize(cur.get("Value")) == normalize(want) and int(cur.get("Flags") or 0) == flags:
            return previous, False, int(cur["ModifyIndex"])
        current_index = int(cur["ModifyIndex"]) if cur else 0
        if expect_index is not None and current_index != expect_index:
            raise ApplicationError(
                f"KV {key} changed since it was recorded (ModifyIndex {current_index}, expected {expect_index}); "
                "not overwriting it", type="Conflict", non_retryable=True)
        if isinstance(want, Absent):
            ok = call(f"delete KV {key}", lambda: client.kv.delete(key, cas=current_index))
        else:
            ok = call(f"write KV {key}", lambda: client.kv.put(key, want or b"", cas=current_index, flags=flags))
        if ok:
            _, after = call(f"read back KV {key}", lambda: client.kv.get(key))
            if isinstance(want, Absent):
                if after is not None:
                    raise unavailable(f"deleted KV {key} but it reads back present")
                return previous, True, 0
            if after is None or normalize(after.get("Value")) != normalize(want):
                raise unavailable(f"wrote KV {key} but it reads back differently")
            return previous, True, int(after["ModifyIndex"])
        # CAS lost a race with another writer: read again and decide again.
    raise unavailable(f"KV {key}: check-and-set kept losing to concurrent writers ({CAS_ATTEMPTS} attempts)")


def _want(entry: KvEntry | None) -> bytes | None | Absent:
    return ABSENT if entry is None else (entry.raw() or b"")


def _read_prefix(client: consul.Consul, prefix: str) -> tuple[int, list[dict[str, Any]]]:
    index, entries = call(f"list KV {prefix}", lambda: client.kv.get(prefix, recurse=True))
    return int(index or 0), list(entries or [])
