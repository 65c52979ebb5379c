"""Session store actions (Consul KV): cordon a host, and release the entries of its dead containers atomically.

The store maps each repl to the one container serving it: `<prefix>repls/<repl>` holds JSON
{"repl", "container", "host", ...}; `<prefix>hosts/<host>` holds {"schedulable": false, ...} while a
host is cordoned. An entry pointing at a dead container is a stuck session; deleting it lets the
platform start the repl elsewhere, so it is deleted only once its container is verified gone, and
only if it still points there (delete-cas), so a repl never has two containers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import consul
import consul.exceptions as cex
from consul.callback import CB
from temporalio.exceptions import ApplicationError

from activities._clients import CLIENT_ERRORS, consul_client, consul_http, translate, unavailable
from activities.binding import implements, invalid_argument
from activities.consul._kv import CAS_ATTEMPTS, _read_prefix, kv_ensure
from activities.consul.kv import kv_undo
from activities.containers import live_containers
from activities.contracts.containers import ListInput
from activities.contracts.sessions import (
    CORDON,
    RELEASE,
    CordonInput,
    CordonOutput,
    ReleaseInput,
    ReleaseOutput,
)
from activities.heartbeats import heartbeating

__all__ = ["cordon", "release"]

# Consul refuses a transaction of more than 64 operations.
_TXN_MAX_OPS = 64


@implements(CORDON)
def cordon(inp: CordonInput) -> CordonOutput:
    key = f"{inp.store_prefix}hosts/{inp.host}"
    value = json.dumps({"schedulable": False, "reason": inp.reason}, sort_keys=True).encode()
    previous, changed, index = kv_ensure(consul_client(inp.consul), key, value)
    return CordonOutput(key=key, changed=changed, undo=kv_undo(inp.consul, key, previous, index if changed else None))


def _entries(client: consul.Consul, prefix: str, host: str) -> dict[str, tuple[int, dict[str, Any]]]:
    """The host's entries: key -> (ModifyIndex, value)."""
    _, raw = _read_prefix(client, prefix)
    found: dict[str, tuple[int, dict[str, Any]]] = {}
    for entry in raw:
        try:
            value = json.loads(entry.get("Value") or b"{}")
        except ValueError:
            continue  # not a session entry: never ours to delete
        if isinstance(value, dict) and value.get("host") == host:
            found[entry["Key"]] = (int(entry["ModifyIndex"]), value)
    return found


def _delete_cas(client: consul.Consul, batch: list[tuple[str, int]]) -> bool:
    """One atomic transaction of delete-cas operations; False (nothing deleted) when any entry changed since read."""
    ops = [{"KV": {"Verb": "delete-cas", "Key": key, "Index": index}} for key, index in batch]
    try:
        # py-consul's txn.put sends no ACL token: call its HTTP layer with the client's headers.
        consul_http(client).put(CB.json(), "/v1/txn", data=json.dumps(ops), headers=client.prepare_headers())
    except cex.ClientError as exc:
        code, _, body = str(exc).partition(" ")
        if code != "409":
            raise translate("delete session entries", exc) from None
        try:
            errors = [e.get("What", "") for e in json.loads(body).get("Errors") or []]
        except (ValueError, AttributeError):
            errors = [body[:200]]
        if errors and all("index is stale" in e for e in errors):
            return False  # Consul rolled the transaction back: an entry changed after we read it
        raise ApplicationError(f"delete session entries: rolled back: {'; '.join(errors)[:300]}",
                               type="Rejected", non_retryable=True) from None
    except CLIENT_ERRORS as exc:
        raise translate("delete session entries", exc) from None
    return True


@implements(RELEASE)
@heartbeating
async def release(inp: ReleaseInput) -> ReleaseOutput:
    return await _release(inp)


async def _release(inp: ReleaseInput, read_entries: Callable[..., dict[str, tuple[int, dict[str, Any]]]] = _entries
                   ) -> ReleaseOutput:
    """release(), with the store reader injectable (tests race a re-placement against it)."""
    if not inp.assume_host_dead and not (inp.hosts and inp.cgroup_parent):
        raise invalid_argument("sessions.release needs hosts and cgroup_parent to verify which containers are "
                               "gone, or assume_host_dead: true")
    started = time.monotonic()
    client = consul_client(inp.consul)
    prefix = f"{inp.store_prefix}repls/"
    alive: set[str] = set()
    if not inp.assume_host_dead:
        state = await live_containers(ListInput(host=inp.host, hosts=inp.hosts, cgroup_parent=inp.cgroup_parent))
        alive = set(state.alive)
    wanted: dict[str, str] = {}  # key -> repl, every dead entry seen
    released: set[str] = set()
    kept: list[str] = []
    for _ in range(CAS_ATTEMPTS):
        entries = await asyncio.to_thread(read_entries, client, prefix, inp.host)
        kept = sorted(v.get("repl", k) for k, (_, v) in entries.items() if v.get("container") in alive)
        dead = sorted((k, i) for k, (i, v) in entries.items() if v.get("container") not in alive)
        wanted.update({k: entries[k][1].get("repl", k) for k, _ in dead})
        lost = False
        for first in range(0, len(dead), _TXN_MAX_OPS):
            batch = dead[first:first + _TXN_MAX_OPS]
            if await asyncio.to_thread(_delete_cas, client, batch):
                released.update(k for k, _ in batch)
            else:
                lost = True  # read again: the changed entries are decided afresh
        if not lost:
            break
    else:
        raise unavailable(f"{inp.host}: session entries kept changing under the release ({CAS_ATTEMPTS} attempts); "
                          f"released {len(released)}: {', '.join(sorted(wanted[k] for k in released)[:20])}")
    # Seen dead, not deleted by us, and no longer the host's: re-pointed elsewhere meanwhile.
    moved = sorted(wanted[k] for k in wanted if k not in released)
    names = sorted(wanted[k] for k in released)
    if inp.require_all and kept:
        raise ApplicationError(
            f"{inp.host}: released {len(names)} entries; {len(kept)} still point at live containers: "
            f"{', '.join(kept[:20])}", {"released": names, "kept_live": kept}, type="ContainersLeft")
    return ReleaseOutput(host=inp.host, released=names, released_count=len(names), kept_live=kept, moved=moved,
                         seconds=round(time.monotonic() - started, 4), finished_at=round(time.time(), 3))
