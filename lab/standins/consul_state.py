"""State of the modelled Consul cluster: raft membership, KV, agent services/checks, faults and metrics."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .clock import Clock, RealClock
from .consul_load import LoadModel, LoadParams
from .consul_snapshot import (
    FsmState,
    SnapshotError,
    build_archive,
    decode_state,
    encode_peers,
    encode_state,
    read_archive,
)
from .persist import load_json, save_json
from .promtext import SampleWindow, Series

__all__ = [
    "STREAMING_KEY",
    "CasError",
    "ConsulCluster",
    "LeaderError",
    "ServerMember",
    "ci_get",
    "go_duration",
    "parse_duration",
    "public_check",
]

STREAMING_KEY = "coldstart/flags/streaming"
CONSUL_VERSION = "1.10.3"  # the release Roblox ran when streaming shipped
# A check's type by the field that defines it, in Consul's order of precedence; none of them: a TTL check.
CHECK_TYPES = (("Args", "script"), ("ScriptArgs", "script"), ("DockerContainerID", "docker"), ("HTTP", "http"),
               ("TCP", "tcp"), ("UDP", "udp"), ("GRPC", "grpc"), ("H2PING", "h2ping"), ("AliasNode", "alias"),
               ("AliasService", "alias"), ("OSService", "os_service"))
INTERVAL_TYPES = ("script", "docker", "http", "tcp", "udp", "grpc", "h2ping", "os_service")
# GET /v1/agent/checks and the health endpoints, field for field as Consul 1.22.7 answers.
PUBLIC_CHECK_FIELDS = ("Node", "CheckID", "Name", "Status", "Notes", "Output", "ServiceID", "ServiceName",
                       "ServiceTags", "Type", "Interval", "Timeout", "ExposedPort", "Definition", "CreateIndex",
                       "ModifyIndex")
LAST_CONTACT_THRESHOLD_MS = 200.0  # autopilot default LastContactThreshold
SUMMARY_EXPIRY_S = 60.0  # go-metrics drops a summary not updated for a minute
_NS = uuid.UUID("6ba7b812-9dad-11d1-80b4-00c04fd430c8")


class CasError(Exception):
    """A check-and-set did not match."""


class LeaderError(Exception):
    """A raft leadership operation was refused."""


def ci_get(data: dict[str, Any], name: str, default: Any = None) -> Any:
    """Consul decodes request bodies case-insensitively and accepts snake_case
    (lib.TranslateKeys), so py-consul's lower-case keys must match too."""
    want = name.lower().replace("_", "")
    for key, value in data.items():
        if key.lower().replace("_", "") == want:
            return value
    return default


def go_duration(ms: float) -> str:
    """Format like Go's time.Duration.String(), which Consul uses for LastContact."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms:.6f}".rstrip("0").rstrip(".") + "ms"
    return f"{ms / 1000:.6f}".rstrip("0").rstrip(".") + "s"


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class ServerMember:
    name: str
    address: str
    raft_addr: str
    node_id: str = ""
    freelist_bytes: float = 0.0
    kvs_apply: SampleWindow = field(default_factory=SampleWindow)
    last_contact: SampleWindow = field(default_factory=SampleWindow)
    commit_time: SampleWindow = field(default_factory=SampleWindow)
    synth_at: float = 0.0
    stable_since: float = 0.0

    def __post_init__(self) -> None:
        if not self.node_id:
            self.node_id = str(uuid.uuid5(_NS, f"consul-server:{self.name}"))


class ConsulCluster:
    """One object models every server; HTTP listeners pick which member answers."""

    def __init__(
        self,
        servers: list[tuple[str, str, str]],
        datacenter: str = "dc1",
        clock: Clock | None = None,
        params: LoadParams | None = None,
        seed: int = 0,
        acl_token: str | None = None,
        state_dir: Path | None = None,
        streaming_key: str = STREAMING_KEY,
    ) -> None:
        if not servers:
            raise ValueError("a cluster needs at least one server")
        self.clock = clock or RealClock()
        self.model = LoadModel(params, seed)
        self.params = self.model.params
        self.datacenter = datacenter
        self.acl_token = acl_token
        self.state_dir = Path(state_dir) if state_dir else None
        self.streaming_key = streaming_key
        # client agent name -> its use_streaming_backend, as loaded from its config directory
        self.client_streaming: dict[str, bool] = {}
        self._rng = random.Random(seed + 1)
        now = self.clock.time()
        self.members: dict[str, ServerMember] = {}
        for name, address, raft_addr in servers:
            m = ServerMember(name, address, raft_addr, synth_at=now, stable_since=now)
            m.freelist_bytes = self.params.freelist_base_bytes
            self.members[name] = m
        self.leader = servers[0][0]
        self.term = 2
        self.index = 1  # raft index: every write advances it
        self.kv_index = 1
        self.catalog_index = 1
        self.kv: dict[str, dict[str, Any]] = {}
        self.tombstones: dict[str, int] = {}
        # Agent-local services/checks per node; the catalog is their union (anti-entropy).
        self.services: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in self.members}
        self.checks: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in self.members}
        self.slow_server: str | None = None
        self.background_rps = 0.0
        self.generation = 0  # bumped by snapshot restore to abandon blocking queries
        self._event: asyncio.Event | None = None
        self.dirty = False
        self._load_state()

    # ---- persistence -------------------------------------------------------------
    @property
    def state_file(self) -> Path | None:
        return self.state_dir / "consul-state.json" if self.state_dir else None

    def _load_state(self) -> None:
        if self.state_file is None:
            return
        data = load_json(self.state_file)
        if not data:
            return
        self.index = data["index"]
        self.term = data["term"]
        self.kv_index = data["kv_index"]
        self.catalog_index = data["catalog_index"]
        self.kv = data["kv"]
        self.tombstones = data["tombstones"]
        if data.get("leader") in self.members:
            self.leader = data["leader"]
        for node in self.members:
            self.services[node] = data["services"].get(node, {})
            self.checks[node] = data["checks"].get(node, {})

    def save_state(self) -> None:
        if self.state_file is None or not self.dirty:
            return
        self.dirty = False
        save_json(
            self.state_file,
            {
                "index": self.index,
                "term": self.term,
                "leader": self.leader,
                "kv_index": self.kv_index,
                "catalog_index": self.catalog_index,
                "kv": self.kv,
                "tombstones": self.tombstones,
                "services": self.services,
                "checks": self.checks,
            },
        )

    # ---- change notification / blocking queries ---------------------------------
    def _changed(self) -> None:
        self.dirty = True
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait_change(self, timeout: float) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass

    def _next_index(self) -> int:
        self.index += 1
        return self.index

    # ---- model inputs ------------------------------------------------------------
    def streaming(self) -> bool:
        """Streaming load: the fault's flag is on and, when the stand-in serves client agents, one of them still
        reads through the streaming backend (their own configuration, as on real agents)."""
        entry = self.kv.get(self.streaming_key)
        if not entry or entry["Value"] is None:
            return False
        if self.client_streaming and not any(self.client_streaming.values()):
            return False
        return base64.b64decode(entry["Value"]).decode(errors="replace").strip().lower() == "true"

    def note_request(self) -> None:
        self.model.note_request(self.clock.time())

    def load(self, now: float | None = None) -> float:
        now = self.clock.time() if now is None else now
        return self.model.effective_load(now, self.streaming(), self.background_rps)

    def leader_slow(self) -> bool:
        return self.slow_server is not None and self.slow_server == self.leader

    # ---- faults (lab admin API) --------------------------------------------------
    def fault_contention(self, background_rps: float | None = None) -> None:
        self.synthesize()
        self._kv_write_internal(self.streaming_key, b"true")
        self.background_rps = (
            self.params.default_background_rps if background_rps is None else float(background_rps)
        )

    def fault_slow_leader(self, server: str) -> None:
        if server not in self.members:
            raise KeyError(server)
        self.synthesize()
        self.slow_server = server

    def set_background(self, rps: float) -> None:
        self.synthesize()
        self.background_rps = float(rps)

    def clear_faults(self) -> None:
        self.synthesize()
        if self.streaming():
            self._kv_write_internal(self.streaming_key, b"false")
        self.background_rps = 0.0
        self.slow_server = None
        for m in self.members.values():
            m.freelist_bytes = self.params.freelist_base_bytes

    def faults(self) -> dict[str, Any]:
        now = self.clock.time()
        return {
            "streaming": self.streaming(),
            "background_rps": self.background_rps,
            "slow_server": self.slow_server,
            "leader": self.leader,
            "client_rps": self.model.client_rate(now),
            "effective_load": self.load(now),
            "apply_ms_now": self.model.apply_ms(self.load(now), self.leader_slow(), jitter=False),
        }

    # ---- synthetic raft telemetry ------------------------------------------------
    def synthesize(self) -> None:
        """Emit the telemetry raft produces on its own between scrapes: one leader
        contact/commit sample per second and the background load's applies."""
        now = self.clock.time()
        load = self.load(now)
        slow = self.leader_slow()
        window = self.params.rate_window_s
        for m in self.members.values():
            elapsed = now - m.synth_at
            if elapsed < 1.0:
                continue
            span = min(elapsed, m.last_contact.max_age)
            n = max(1, min(int(span), 20))
            for i in range(n):
                t = now - span + span * (i + 1) / n
                m.last_contact.observe(t, self.model.contact_ms(load, slow))
                m.commit_time.observe(t, self.model.commit_ms(load, slow))
            if m.name == self.leader and self.background_rps > 0:
                nb = max(1, min(int(self.background_rps * min(elapsed, window)), 50))
                for i in range(nb):
                    t = now - span + span * (i + 1) / nb
                    m.kvs_apply.observe(t, self.model.apply_ms(load, slow))
            if m.name == self.slow_server:
                m.freelist_bytes += self.params.freelist_growth_per_s * elapsed
            m.synth_at = now

    def begin_apply(self) -> float:
        """Modelled latency (ms) of a KV apply starting now."""
        self.synthesize()
        return self.model.apply_ms(self.load(), self.leader_slow())

    def finish_apply(self, latency_ms: float) -> None:
        now = self.clock.time()
        self.members[self.leader].kvs_apply.observe(now, latency_ms)
        if self.slow_server is not None:
            self.members[self.slow_server].freelist_bytes += self.params.freelist_growth_per_apply

    # ---- raft / autopilot --------------------------------------------------------
    def member_by_id(self, node_id: str) -> ServerMember | None:
        for m in self.members.values():
            if m.node_id == node_id:
                return m
        return None

    def transfer_leader(self, target_id: str | None) -> ServerMember:
        self.synthesize()
        current = self.members[self.leader]
        if target_id:
            target = self.member_by_id(target_id)
            if target is None:
                raise LeaderError(f"cannot find peer {target_id}")
            if target.name == self.leader:
                raise LeaderError("cannot transfer leadership to itself")
        else:
            # Raft picks the most up-to-date follower; a slow disk lags, so prefer healthy ones.
            others = [m for m in self.members.values() if m.name != current.name]
            if not others:
                raise LeaderError("cannot find a peer to transfer leadership to")
            others.sort(key=lambda m: (m.name == self.slow_server, m.name))
            target = others[0]
        self.leader = target.name
        self.term += 1
        self._next_index()  # the new leader commits a no-op entry
        now = self.clock.time()
        for m in self.members.values():
            m.stable_since = now
        self._changed()
        return target

    def raft_configuration(self) -> dict[str, Any]:
        return {
            "Servers": [
                {
                    "ID": m.node_id,
                    "Node": m.name,
                    "Address": m.raft_addr,
                    "Leader": m.name == self.leader,
                    "ProtocolVersion": "3",
                    "Voter": True,
                    "LastIndex": self.index,
                }
                for m in self.members.values()
            ],
            "Index": self.index,
        }

    def follower_contact_ms(self) -> float:
        return self.model.contact_ms(self.load(), self.leader_slow(), jitter=False)

    def autopilot_health(self) -> dict[str, Any]:
        contact = self.follower_contact_ms()
        servers = []
        for m in self.members.values():
            is_leader = m.name == self.leader
            last = 0.0 if is_leader else contact
            servers.append(
                {
                    "ID": m.node_id,
                    "Name": m.name,
                    "Address": m.raft_addr,
                    "SerfStatus": "alive",
                    "Version": CONSUL_VERSION,
                    "Leader": is_leader,
                    "LastContact": go_duration(last),
                    "LastTerm": self.term,
                    "LastIndex": self.index,
                    "Healthy": last <= LAST_CONTACT_THRESHOLD_MS,
                    "Voter": True,
                    "StableSince": rfc3339(m.stable_since),
                }
            )
        healthy_voters = sum(1 for s in servers if s["Healthy"])
        quorum = len(servers) // 2 + 1
        return {
            "Healthy": all(s["Healthy"] for s in servers),
            "FailureTolerance": max(0, healthy_voters - quorum),
            "Servers": servers,
        }

    # ---- KV ------------------------------------------------------------------------
    def _kv_write_internal(self, key: str, value: bytes | None, flags: int = 0) -> None:
        idx = self._next_index()
        old = self.kv.get(key)
        self.kv[key] = {
            "Key": key,
            "Flags": flags,
            "Value": None if value is None else base64.b64encode(value).decode(),
            "LockIndex": old["LockIndex"] if old else 0,
            "CreateIndex": old["CreateIndex"] if old else idx,
            "ModifyIndex": idx,
        }
        self.tombstones.pop(key, None)
        self.kv_index = idx
        self._changed()

    def kv_set(self, key: str, value: bytes | None, flags: int = 0, cas: int | None = None) -> bool:
        old = self.kv.get(key)
        if cas is not None:
            if cas == 0 and old is not None:
                return False
            if cas != 0 and (old is None or old["ModifyIndex"] != cas):
                return False
        self._kv_write_internal(key, value, flags)
        return True

    def kv_delete(self, key: str, recurse: bool = False, cas: int | None = None) -> bool:
        if cas is not None and not recurse:
            old = self.kv.get(key)
            if cas == 0 or old is None or old["ModifyIndex"] != cas:
                return False
        victims = [k for k in self.kv if k.startswith(key)] if recurse else [key]
        idx = self._next_index()
        for k in victims:
            if self.kv.pop(k, None) is not None:
                self.tombstones[k] = idx
        self.kv_index = idx
        self._changed()
        return True

    def kv_txn(self, ops: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Consul's txnKVS: every op runs against the state so far; any error rolls all of it back.

        Returns (results, errors). Results hold an entry for set, cas, get, get-tree and check-index
        (the value only for reads), as real Consul 1.22 answers /v1/txn."""
        work = {k: dict(v) for k, v in self.kv.items()}
        deleted: set[str] = set()
        idx = self.index + 1
        results: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []

        def fail(i: int, what: str) -> None:
            errors.append({"OpIndex": i, "What": what})

        def put(key: str, value: str | None, flags: int) -> dict[str, Any]:
            old = work.get(key)
            work[key] = {"Key": key, "Flags": flags, "Value": value, "LockIndex": old["LockIndex"] if old else 0,
                         "CreateIndex": old["CreateIndex"] if old else idx, "ModifyIndex": idx}
            deleted.discard(key)
            return {**work[key], "Value": None}

        for i, op in enumerate(ops):
            kv = op.get("KV") or {}
            verb, key = kv.get("Verb", ""), kv.get("Key", "")
            cas = int(kv.get("Index") or 0)
            old = work.get(key)
            if verb == "set":
                results.append({"KV": put(key, kv.get("Value"), int(kv.get("Flags") or 0))})
            elif verb == "cas":
                if (old is None and cas != 0) or (old is not None and old["ModifyIndex"] != cas):
                    fail(i, f'failed to set key "{key}", index is stale')
                else:
                    results.append({"KV": put(key, kv.get("Value"), int(kv.get("Flags") or 0))})
            elif verb in ("delete", "delete-cas", "delete-tree"):
                if verb == "delete-cas" and ((old is None and cas != 0) or (old is not None and old["ModifyIndex"] != cas)):
                    fail(i, f'failed to delete key "{key}", index is stale')
                    continue
                victims = [k for k in work if k.startswith(key)] if verb == "delete-tree" else [key]
                for k in victims:
                    if work.pop(k, None) is not None:
                        deleted.add(k)
            elif verb == "get":
                if old is None:
                    fail(i, f'key "{key}" doesn\'t exist')
                else:
                    results.append({"KV": dict(old)})
            elif verb == "get-tree":
                results.extend({"KV": dict(work[k])} for k in sorted(work) if k.startswith(key))
            elif verb == "check-index":
                if old is None:
                    fail(i, f'key "{key}" doesn\'t exist')
                elif old["ModifyIndex"] != cas:
                    fail(i, f'failed index check for key "{key}", current modify index {old["ModifyIndex"]} != {cas}')
                else:
                    results.append({"KV": {**old, "Value": None}})
            elif verb == "check-not-exists":
                if old is not None:
                    fail(i, f'key "{key}" exists')
            else:
                # Sessions are not modelled, so lock, unlock and check-session are refused like an unknown verb.
                fail(i, f"unknown KV operation: {verb}")
        if errors:
            return [], errors
        if work != self.kv or deleted:
            self.index = idx
            for k in deleted:
                self.tombstones[k] = idx
            for k, entry in work.items():
                if entry["ModifyIndex"] == idx:
                    self.tombstones.pop(k, None)
            self.kv.clear()
            self.kv.update(work)
            self.kv_index = idx
            self._changed()
        return results, []

    def kv_get_index(self) -> int:
        return max(1, self.kv_index)

    def kv_list_index(self, prefix: str) -> int:
        # Mirrors kvsListTxn: highest index among the prefix's entries and
        # tombstones, falling back to the table index.
        if prefix == "":
            return self.kv_get_index()
        idx = max((e["ModifyIndex"] for k, e in self.kv.items() if k.startswith(prefix)), default=0)
        idx = max([idx] + [i for k, i in self.tombstones.items() if k.startswith(prefix)])
        return idx or self.kv_get_index()

    # ---- snapshots -------------------------------------------------------------------
    def _snapshot_meta(self, taken_ms: int) -> dict[str, Any]:
        """raft.SnapshotMeta as meta.json carries it (Size is added with the payload)."""
        servers = list(self.members.values())
        return {
            "Version": 1,
            "ID": f"{self.term}-{self.index}-{taken_ms}",
            "Index": self.index,
            "Term": self.term,
            "Peers": encode_peers([m.raft_addr for m in servers]),
            "Configuration": {"Servers": [{"Suffrage": 0, "ID": m.node_id, "Address": m.raft_addr} for m in servers]},
            "ConfigurationIndex": 1,
        }

    def snapshot_save(self) -> tuple[bytes, int]:
        """The KV table as Consul's FSM records; the catalog is agent-local here and left out."""
        # raft names a snapshot by the server's wall clock (time.Now), which nothing in Consul
        # models; the actions date snapshots against the wall clock too. The Clock drives telemetry.
        now = time.time()
        meta = self._snapshot_meta(int(now * 1000))
        indexes = {"kvs": self.kv_index}
        if self.tombstones:
            indexes["tombstones"] = max(self.tombstones.values())
        state = FsmState(self.index, self.kv, self.tombstones, indexes)
        body = build_archive(meta, encode_state(state), now)
        if self.state_dir is not None:
            snaps = self.state_dir / "snapshots"
            snaps.mkdir(parents=True, exist_ok=True)
            (snaps / f"{meta['ID']}.snap").write_bytes(body)
        return body, self.index

    def snapshot_restore(self, body: bytes) -> None:
        """Replace the KV table (entries, tombstones, table index); raises SnapshotError on a bad archive."""
        meta, blob = read_archive(body)
        if meta.get("Size") != len(blob):
            raise SnapshotError(f"failed to restore snapshot: failed to write snapshot, size didn't match "
                                f"({len(blob)} != {meta.get('Size')})")
        state = decode_state(blob)
        self.kv = state.kv
        self.tombstones = state.tombstones
        # As in Consul: KV reads report the snapshot's table index again, while the raft index moves on.
        self.kv_index = max([1, state.indexes.get("kvs", 0), *(e["ModifyIndex"] for e in self.kv.values())])
        self.index = max(self.index, int(meta.get("Index", 0)), state.last_index) + 1
        self.generation += 1
        self._changed()

    # ---- agent services and checks ----------------------------------------------------
    def _touch_catalog(self) -> int:
        idx = self._next_index()
        self.catalog_index = idx
        self._changed()
        return idx

    def register_service(self, node: str, body: dict[str, Any], replace_checks: bool = False) -> None:
        name = ci_get(body, "Name")
        if not name:
            raise ValueError("Missing service name")
        sid = ci_get(body, "ID") or name
        old = self.services[node].get(sid)
        idx = self._touch_catalog()
        weights = ci_get(body, "Weights") or {"Passing": 1, "Warning": 1}
        self.services[node][sid] = {
            "ID": sid,
            "Service": name,
            "Tags": list(ci_get(body, "Tags") or []),
            "Meta": dict(ci_get(body, "Meta") or {}),
            "Port": int(ci_get(body, "Port") or 0),
            "Address": ci_get(body, "Address") or "",
            "TaggedAddresses": ci_get(body, "TaggedAddresses") or {},
            "Weights": {"Passing": ci_get(weights, "Passing", 1), "Warning": ci_get(weights, "Warning", 1)},
            "EnableTagOverride": bool(ci_get(body, "EnableTagOverride", False)),
            "Kind": ci_get(body, "Kind") or "",
            "Datacenter": self.datacenter,
            "CreateIndex": old["CreateIndex"] if old else idx,
            "ModifyIndex": idx,
        }
        defs = list(ci_get(body, "Checks") or [])
        single = ci_get(body, "Check")
        if single:
            defs.insert(0, single)
        if replace_checks:
            for cid in [c for c, v in self.checks[node].items() if v["ServiceID"] == sid]:
                del self.checks[node][cid]
        for i, chk in enumerate(defs):
            default_id = f"service:{sid}" if len(defs) == 1 else f"service:{sid}:{i + 1}"
            self.register_check(
                node,
                dict(chk, ServiceID=sid),
                default_id=default_id,
                default_name=f"Service '{name}' check",
                embedded=True,
            )

    def deregister_service(self, node: str, sid: str) -> bool:
        if sid not in self.services[node]:
            return False
        del self.services[node][sid]
        for cid in [c for c, v in self.checks[node].items() if v["ServiceID"] == sid]:
            del self.checks[node][cid]
        self._touch_catalog()
        return True

    def register_check(
        self,
        node: str,
        body: dict[str, Any],
        default_id: str | None = None,
        default_name: str | None = None,
        embedded: bool = False,
    ) -> None:
        """PUT /v1/agent/check/register, or one of a service registration's checks (`embedded`).

        As Consul 1.22.7: the check's type comes from the field given, Interval/Timeout are kept as
        Go duration strings ("" when unset in a service's check, "0s" when unset in a standalone
        one), and re-registering an existing ID keeps its status and output (no flapping).
        """
        name = ci_get(body, "Name") or default_name
        if not name:
            raise ValueError("Missing check name")
        cid = ci_get(body, "CheckID") or ci_get(body, "ID") or default_id or name
        sid = ci_get(body, "ServiceID") or ""
        if sid and sid not in self.services[node]:
            raise LookupError(f'ServiceID "{sid}" does not exist')
        ttl_ns = duration_ns(ci_get(body, "TTL"))
        interval_ns = duration_ns(ci_get(body, "Interval"))
        timeout_ns = duration_ns(ci_get(body, "Timeout"))
        ctype = next((kind for field, kind in CHECK_TYPES if ci_get(body, field)), "ttl")
        # structs.CheckType.Validate's order.
        if ctype in INTERVAL_TYPES and interval_ns <= 0:
            raise ValueError("Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP, UDP or OSService "
                             "checks")
        if ttl_ns and interval_ns:
            raise ValueError("Invalid check: Interval and TTL cannot both be specified")
        if ctype == "ttl" and ttl_ns <= 0:
            raise ValueError("Invalid check: TTL must be > 0 for TTL checks")
        svc = self.services[node].get(sid) if sid else None
        old = self.checks[node].get(cid)
        chk_type = check_type(body, ctype, interval_ns, timeout_ns, ttl_ns)
        idx = self._touch_catalog()

        def shown(ns: int) -> str:
            return "" if embedded and not ns else go_duration_ns(ns)

        self.checks[node][cid] = {
            "Node": node,
            "CheckID": cid,
            "Name": name,
            # A new check starts critical unless the definition sets Status; a re-registered one keeps its state.
            "Status": old["Status"] if old else (ci_get(body, "Status") or "critical"),
            "Notes": ci_get(body, "Notes") or "",
            "Output": old["Output"] if old else "",
            "ServiceID": sid,
            "ServiceName": svc["Service"] if svc else "",
            "ServiceTags": list(svc["Tags"]) if svc else [],
            "Type": ctype,
            "Interval": shown(interval_ns),
            "Timeout": shown(timeout_ns),
            "TTLSeconds": ttl_ns / 1e9 if ttl_ns else None,
            # Not shown by any endpoint (public_check), as on the real agent: see check_type.
            "ChkType": chk_type,
            "UpdatedAt": self.clock.time(),
            "CreateIndex": old["CreateIndex"] if old else idx,
            "ModifyIndex": idx,
        }

    def deregister_check(self, node: str, cid: str) -> bool:
        if cid not in self.checks[node]:
            return False
        del self.checks[node][cid]
        self._touch_catalog()
        return True

    def update_check(self, node: str, cid: str, status: str, output: str | None) -> None:
        chk = self.checks[node].get(cid)
        if chk is None:
            raise LookupError(f'Unknown check ID "{cid}". Ensure that the check ID is passed, not the check name.')
        if chk["Type"] != "ttl":
            raise ValueError(f'CheckID "{cid}" does not have associated TTL')
        chk["UpdatedAt"] = self.clock.time()
        if chk["Status"] != status or (output is not None and chk["Output"] != output):
            chk["Status"] = status
            chk["Output"] = output or ""
            chk["ModifyIndex"] = self._touch_catalog()

    def expire_ttls(self) -> None:
        now = self.clock.time()
        for node_checks in self.checks.values():
            for chk in node_checks.values():
                ttl = chk.get("TTLSeconds")
                if ttl and chk["Status"] != "critical" and now - chk["UpdatedAt"] > ttl:
                    chk["Status"] = "critical"
                    chk["Output"] = "TTL expired"
                    chk["ModifyIndex"] = self._touch_catalog()

    # ---- catalog views ---------------------------------------------------------------
    def node_view(self, node: str) -> dict[str, Any]:
        m = self.members[node]
        return {
            "ID": m.node_id,
            "Node": m.name,
            "Address": m.address,
            "Datacenter": self.datacenter,
            "TaggedAddresses": {"lan": m.address, "lan_ipv4": m.address, "wan": m.address, "wan_ipv4": m.address},
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": 1,
            "ModifyIndex": 1,
        }

    def all_services(self) -> list[tuple[str, dict[str, Any]]]:
        """(node, service) pairs including the built-in `consul` service of each server."""
        out = []
        for node, m in self.members.items():
            port = int(m.raft_addr.rsplit(":", 1)[1])
            out.append(
                (
                    node,
                    {
                        "ID": "consul",
                        "Service": "consul",
                        "Tags": [],
                        "Meta": {"raft_version": "3", "serf_protocol_current": "2", "version": CONSUL_VERSION},
                        "Port": port,
                        "Address": "",
                        "TaggedAddresses": {},
                        "Weights": {"Passing": 1, "Warning": 1},
                        "EnableTagOverride": False,
                        "Kind": "",
                        "Datacenter": self.datacenter,
                        "CreateIndex": 1,
                        "ModifyIndex": 1,
                    },
                )
            )
            out.extend((node, svc) for svc in self.services[node].values())
        return out

    def serf_check(self, node: str) -> dict[str, Any]:
        return {
            "Node": node,
            "CheckID": "serfHealth",
            "Name": "Serf Health Status",
            "Status": "passing",
            "Notes": "",
            "Output": "Agent alive and reachable",
            "ServiceID": "",
            "ServiceName": "",
            "ServiceTags": [],
            "Type": "",
            "Interval": "",
            "Timeout": "",
            "ExposedPort": 0,
            "Definition": {},
            "CreateIndex": 1,
            "ModifyIndex": 1,
        }

    def node_checks(self, node: str) -> list[dict[str, Any]]:
        return [self.serf_check(node)] + [public_check(c) for c in self.checks[node].values()]

    # ---- metrics ----------------------------------------------------------------------
    def metric_series(self, server: str) -> list[Series]:
        self.synthesize()
        now = self.clock.time()
        m = self.members[server]
        health = self.autopilot_health()
        out: list[Series] = []
        for name, window in (
            ("consul_kvs_apply", m.kvs_apply),
            ("consul_raft_leader_lastContact", m.last_contact),
            ("consul_raft_commitTime", m.commit_time),
        ):
            if window.last_update is None or now - window.last_update > SUMMARY_EXPIRY_S:
                continue
            out.append(
                Series(name, "summary", quantiles=window.quantiles(now), count=window.count, total=window.total)
            )
        out.append(Series("consul_raft_boltdb_freelistBytes", "gauge", m.freelist_bytes))
        out.append(Series("consul_autopilot_healthy", "gauge", 1.0 if health["Healthy"] else 0.0))
        out.append(Series("consul_autopilot_failure_tolerance", "gauge", float(health["FailureTolerance"])))
        out.append(Series("consul_server_isLeader", "gauge", 1.0 if server == self.leader else 0.0))
        out.append(Series("consul_raft_state_term", "gauge", float(self.term)))
        return out


# The agent's own record of a check's registration (Consul's structs.CheckType) as a real agent persists it in
# its data dir, checks/<sha256 of the check ID>: {"Check": ..., "ChkType": {...}, "Token", "Source"}. Durations
# are integer nanoseconds; unset fields are zero values, as Go writes them.
CHECK_TYPE_FIELDS = {
    "CheckID": "", "Name": "", "Status": "", "Notes": "", "ScriptArgs": None, "HTTP": "", "H2PING": "",
    "H2PingUseTLS": False, "Header": None, "Method": "", "Body": "", "DisableRedirects": False, "TCP": "",
    "TCPUseTLS": False, "UDP": "", "Interval": 0, "AliasNode": "", "AliasService": "", "DockerContainerID": "",
    "Shell": "", "GRPC": "", "GRPCUseTLS": False, "OSService": "", "TLSServerName": "", "TLSSkipVerify": False,
    "Timeout": 0, "TTL": 0, "SuccessBeforePassing": 0, "FailuresBeforeWarning": 0, "FailuresBeforeCritical": 0,
    "ProxyHTTP": "", "ProxyGRPC": "", "DeregisterCriticalServiceAfter": 0, "OutputMaxSize": 0,
}
_CHECK_TYPE_DURATIONS = ("Interval", "Timeout", "TTL", "DeregisterCriticalServiceAfter")
MIN_CHECK_INTERVAL_NS = 10**9  # checks.MinInterval: the agent raises a shorter interval to it


def check_type(body: dict[str, Any], ctype: str, interval_ns: int, timeout_ns: int, ttl_ns: int) -> dict[str, Any]:
    """The CheckType a Consul 1.22.7 agent keeps for a check registered from `body`: the registration's own
    fields (HTTP target, Method, Header, Body, TCP address, ...), as given, with the agent's defaults applied
    (a shorter interval raised to 1s, H2PingUseTLS on for H2PING, FailuresBeforeWarning = FailuresBeforeCritical).
    No endpoint shows it: HealthCheck.Definition stays empty for agent-registered checks."""
    out = dict(CHECK_TYPE_FIELDS)
    for name in CHECK_TYPE_FIELDS:
        value = ci_get(body, name)
        if value is not None and name not in _CHECK_TYPE_DURATIONS:
            out[name] = value
    out["CheckID"] = ci_get(body, "CheckID") or ci_get(body, "ID") or ""
    out["ScriptArgs"] = ci_get(body, "ScriptArgs") or ci_get(body, "Args") or None
    out["Header"] = {k: list(v) for k, v in out["Header"].items()} if out["Header"] else None
    out["Interval"] = max(interval_ns, MIN_CHECK_INTERVAL_NS) if ctype in INTERVAL_TYPES else interval_ns
    out["Timeout"], out["TTL"] = timeout_ns, ttl_ns
    out["DeregisterCriticalServiceAfter"] = duration_ns(ci_get(body, "DeregisterCriticalServiceAfter"))
    if ci_get(body, "H2PingUseTLS") is None:
        out["H2PingUseTLS"] = bool(out["H2PING"])
    if not out["FailuresBeforeWarning"]:
        out["FailuresBeforeWarning"] = out["FailuresBeforeCritical"]
    return out


def public_check(chk: dict[str, Any], agent: bool = False) -> dict[str, Any]:
    """A check as Consul 1.22.7 shows it: the catalog's (health endpoints) or, with `agent`, the local agent's
    (GET /v1/agent/checks: no raft indexes). Neither carries the definition (HTTP target, headers, method)."""
    out = {name: chk.get(name, "") for name in PUBLIC_CHECK_FIELDS}
    out["ExposedPort"] = 0
    out["Definition"] = {}
    if agent:
        out["CreateIndex"] = out["ModifyIndex"] = 0
    return out


def duration_ns(value: Any) -> int:
    """A Go duration from a request body (text, or integer nanoseconds) in nanoseconds; unset is 0."""
    if value in (None, ""):
        return 0
    return round(parse_duration(value) * 1e9)


def go_duration_ns(ns: int) -> str:
    """Go's time.Duration.String() for integer nanoseconds: "0s", "250ms", "1.5s", "1m30s", "1h0m0s"."""
    if ns == 0:
        return "0s"
    sign, ns = ("-" if ns < 0 else ""), abs(ns)

    def frac(value: int, digits: int) -> str:
        whole, rest = divmod(value, 10**digits)
        tail = f"{rest:0{digits}d}".rstrip("0")
        return f"{whole}.{tail}" if tail else str(whole)

    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{frac(ns, 3)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{frac(ns, 6)}ms"
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = frac(rest, 9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    return f"{sign}{minutes}m{text}" if minutes else sign + text


def parse_duration(text: str | float) -> float:
    """Go duration ("10s", "1m30s", "250ms") to seconds; bare numbers are nanoseconds as in Go JSON."""
    if isinstance(text, (int, float)):
        return float(text) / 1e9
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"invalid duration {text!r}")
    return sum(float(n) * units[u] for n, u in parts)
