"""Consul HTTP API stand-in: a 3-server cluster in one process, one listener per server."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from .consul_load import LoadParams
from .consul_snapshot import SnapshotError
from .consul_state import (
    CONSUL_VERSION,
    STREAMING_KEY,
    ConsulCluster,
    LeaderError,
    ci_get,
    go_duration,
    parse_duration,
    public_check,
)
from .listeners import LABEL, ListenSpec, bind_socket, serve_forever
from .promtext import render

__all__ = ["CLUSTER", "SERVER", "build_cluster", "make_app", "run"]

CLUSTER = web.AppKey("cluster", ConsulCluster)
SERVER = web.AppKey("server", str)
MAX_KV_VALUE = 512 * 1024
MAX_WAIT_S = 600.0
DEFAULT_WAIT_S = 300.0
JSON_TYPE = "application/json"
# go-metrics names as the JSON format reports them (Prometheus flattens dots to _).
JSON_NAMES = {
    "consul_kvs_apply": "consul.kvs.apply",
    "consul_raft_leader_lastContact": "consul.raft.leader.lastContact",
    "consul_raft_commitTime": "consul.raft.commitTime",
    "consul_raft_boltdb_freelistBytes": "consul.raft.boltdb.freelistBytes",
    "consul_autopilot_healthy": "consul.autopilot.healthy",
    "consul_autopilot_failure_tolerance": "consul.autopilot.failure_tolerance",
    "consul_server_isLeader": "consul.server.isLeader",
    "consul_raft_state_term": "consul.raft.state.term",
}


class BadRequest(Exception):
    pass


class NotFoundError(Exception):
    pass


# ---- plumbing --------------------------------------------------------------------------
def _cluster(request: web.Request) -> ConsulCluster:
    return request.app[CLUSTER]


def _server(request: web.Request) -> str:
    return request.app[SERVER]


def _json(data: Any, status: int = 200, index: int | None = None, meta: bool = False) -> web.Response:
    # Only reads through the query path (an index, or `meta`) carry Consul's query metadata headers.
    headers = {"X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0"} if index is not None or meta else {}
    if index is not None:
        headers["X-Consul-Index"] = str(index)
    return web.Response(status=status, text=json.dumps(data), content_type=JSON_TYPE, headers=headers)


def _not_found_with_index(index: int) -> web.Response:
    # KV and catalog misses still carry X-Consul-Index so clients can block on creation.
    return web.Response(
        status=404, headers={"X-Consul-Index": str(index), "X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0"}
    )


def _flag(request: web.Request, name: str) -> bool:
    """Consul's getBoolQueryParam: present-and-empty means true, else strconv.ParseBool."""
    if name not in request.query:
        return False
    value = request.query[name].strip().lower()
    return value in ("", "1", "t", "true", "yes")


def request_token(request: web.Request) -> str | None:
    # Consul accepts the token as X-Consul-Token, an Authorization bearer, or ?token=.
    token = request.headers.get("X-Consul-Token")
    if not token:
        auth = request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
    return token or request.query.get("token") or None


async def _blocking(request: web.Request, index_fn: Callable[[], int]) -> int:
    """Blocking query: hold the request until index_fn() passes ?index or ?wait
    (default 5m, max 10m, plus up to wait/16 jitter) elapses.
    https://developer.hashicorp.com/consul/api-docs/features/blocking"""
    cluster = _cluster(request)
    q = request.query
    if "index" not in q:
        return index_fn()
    try:
        min_index = int(q["index"])
    except ValueError as exc:
        raise BadRequest("Invalid index") from exc
    try:
        wait = parse_duration(q["wait"]) if q.get("wait") else DEFAULT_WAIT_S
    except ValueError as exc:
        raise BadRequest("Invalid wait time") from exc
    wait = min(wait, MAX_WAIT_S)
    wait += random.uniform(0, wait / 16)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    generation = cluster.generation
    while True:
        idx = index_fn()
        if min_index == 0 or idx > min_index or cluster.generation != generation:
            return idx
        remaining = deadline - loop.time()
        if remaining <= 0:
            return idx
        await cluster.wait_change(remaining)


@web.middleware
async def consul_middleware(request: web.Request, handler):
    cluster = _cluster(request)
    path = request.path
    if path.startswith("/v1/"):
        if path != "/v1/agent/metrics":
            cluster.note_request()
        # Status endpoints need no ACL in Consul; everything else does once ACLs are on.
        if cluster.acl_token and not path.startswith("/v1/status/"):
            token = request_token(request)
            if token != cluster.acl_token:
                return web.Response(status=403, text="ACL not found" if token else "Permission denied")
        dc = request.query.get("dc")
        if dc and dc != cluster.datacenter:
            return web.Response(status=500, text="No path to datacenter")
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except BadRequest as exc:
        return web.Response(status=400, text=str(exc))
    except NotFoundError as exc:
        return web.Response(status=404, text=str(exc))
    except Exception as exc:  # noqa: BLE001 - Consul surfaces internal errors as 500 + message text
        return web.Response(status=500, text=str(exc))


# ---- status ------------------------------------------------------------------------------
async def status_leader(request: web.Request) -> web.Response:
    """GET /v1/status/leader -- https://developer.hashicorp.com/consul/api-docs/status#get-raft-leader"""
    cluster = _cluster(request)
    return _json(cluster.members[cluster.leader].raft_addr)


async def status_peers(request: web.Request) -> web.Response:
    """GET /v1/status/peers -- https://developer.hashicorp.com/consul/api-docs/status#list-raft-peers"""
    return _json([m.raft_addr for m in _cluster(request).members.values()])


# ---- operator ------------------------------------------------------------------------------
async def raft_configuration(request: web.Request) -> web.Response:
    """GET /v1/operator/raft/configuration -- https://developer.hashicorp.com/consul/api-docs/operator/raft#read-configuration"""
    return _json(_cluster(request).raft_configuration())


async def raft_transfer_leader(request: web.Request) -> web.Response:
    """POST /v1/operator/raft/transfer-leader[?id=] -- https://developer.hashicorp.com/consul/api-docs/operator/raft#transfer-raft-leadership"""
    try:
        _cluster(request).transfer_leader(request.query.get("id") or None)
    except LeaderError as exc:
        return web.Response(status=500, text=str(exc))
    return _json({"Success": True})


async def autopilot_health(request: web.Request) -> web.Response:
    """GET /v1/operator/autopilot/health -- 200 healthy, 429 unhealthy, same body.
    https://developer.hashicorp.com/consul/api-docs/operator/autopilot#read-health"""
    cluster = _cluster(request)
    cluster.synthesize()
    health = cluster.autopilot_health()
    return _json(health, status=200 if health["Healthy"] else 429)


async def autopilot_configuration(request: web.Request) -> web.Response:
    """GET /v1/operator/autopilot/configuration -- https://developer.hashicorp.com/consul/api-docs/operator/autopilot#read-configuration"""
    return _json(
        {
            "CleanupDeadServers": True,
            "LastContactThreshold": "200ms",
            "MaxTrailingLogs": 250,
            "MinQuorum": 0,
            "ServerStabilizationTime": "10s",
            "RedundancyZoneTag": "",
            "DisableUpgradeMigration": False,
            "UpgradeVersionTag": "",
            "CreateIndex": 5,
            "ModifyIndex": 5,
        }
    )


# ---- KV -------------------------------------------------------------------------------------
async def kv_get(request: web.Request) -> web.Response:
    """GET /v1/kv/:key[?recurse|?keys&separator|?raw] with blocking queries.
    https://developer.hashicorp.com/consul/api-docs/kv#read-key"""
    cluster = _cluster(request)
    key = request.match_info["key"]
    if _flag(request, "keys"):
        idx = await _blocking(request, lambda: cluster.kv_list_index(key))
        sep = request.query.get("separator", "")
        found: list[str] = []
        for k in sorted(cluster.kv):
            if not k.startswith(key):
                continue
            rest = k[len(key):]
            if sep and sep in rest:
                k = key + rest[: rest.index(sep) + len(sep)]
            if not found or found[-1] != k:
                found.append(k)
        return _json(found, index=idx) if found else _not_found_with_index(idx)
    if _flag(request, "recurse"):
        idx = await _blocking(request, lambda: cluster.kv_list_index(key))
        entries = [dict(cluster.kv[k]) for k in sorted(cluster.kv) if k.startswith(key)]
        return _json(entries, index=idx) if entries else _not_found_with_index(idx)
    if not key:
        raise BadRequest("Missing key name")
    idx = await _blocking(request, cluster.kv_get_index)
    entry = cluster.kv.get(key)
    if entry is None:
        return _not_found_with_index(idx)
    if _flag(request, "raw"):
        value = base64.b64decode(entry["Value"]) if entry["Value"] else b""
        return web.Response(
            body=value,
            content_type="text/plain",
            headers={"X-Consul-Index": str(idx), "X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0",
                     "X-Content-Type-Options": "nosniff"},
        )
    return _json([dict(entry)], index=idx)


async def kv_put(request: web.Request) -> web.Response:
    """PUT /v1/kv/:key[?cas=&flags=] -> true/false. Latency follows the load model.
    https://developer.hashicorp.com/consul/api-docs/kv#create-update-key"""
    cluster = _cluster(request)
    key = request.match_info["key"]
    q = request.query
    if not key:
        raise BadRequest("Missing key name")
    if "acquire" in q or "release" in q:
        # Sessions are not modelled; real Consul rejects unknown session IDs the same way.
        return web.Response(status=500, text=f'invalid session "{q.get("acquire") or q.get("release")}"')
    body = await request.read()
    if len(body) > MAX_KV_VALUE:
        return web.Response(
            status=413, text=f"Request body(({len(body)} bytes)) too large, max size: {MAX_KV_VALUE} bytes."
        )
    try:
        flags = int(q.get("flags", "0"))
        cas = int(q["cas"]) if "cas" in q else None
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    latency = cluster.begin_apply()
    await cluster.clock.sleep(latency / 1000.0)
    ok = cluster.kv_set(key, body if body else None, flags, cas)
    cluster.finish_apply(latency)
    return _json(ok)


async def kv_delete(request: web.Request) -> web.Response:
    """DELETE /v1/kv/:key[?recurse][?cas=] -> true/false.
    https://developer.hashicorp.com/consul/api-docs/kv#delete-key"""
    cluster = _cluster(request)
    key = request.match_info["key"]
    try:
        cas = int(request.query["cas"]) if "cas" in request.query else None
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    latency = cluster.begin_apply()
    await cluster.clock.sleep(latency / 1000.0)
    ok = cluster.kv_delete(key, recurse=_flag(request, "recurse"), cas=cas)
    cluster.finish_apply(latency)
    return _json(ok)


# ---- transactions -------------------------------------------------------------------------------
_TXN_READS = {"get", "get-tree", "check-index", "check-not-exists", "check-session"}


async def txn(request: web.Request) -> web.Response:
    """PUT /v1/txn with KV operations: all applied or none, 409 with every failing op.
    https://developer.hashicorp.com/consul/api-docs/txn#create-transaction"""
    cluster = _cluster(request)
    try:
        ops = json.loads(await request.read())
        if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
            raise ValueError("json: cannot unmarshal into Go value of type []api.TxnOp")
    except ValueError as exc:
        return web.Response(status=400, text=f"Failed to parse body: {exc}")
    if len(ops) > 128:
        return web.Response(status=413, text=f"Transaction contains too many operations ({len(ops)} > 128)")
    read_only = all((op.get("KV") or {}).get("Verb") in _TXN_READS for op in ops)
    if not read_only:
        latency = cluster.begin_apply()
        await cluster.clock.sleep(latency / 1000.0)
    results, errors = cluster.kv_txn(ops)
    if not read_only:
        cluster.finish_apply(latency)
    body: dict[str, Any] = {"Results": None if errors else results, "Errors": errors or None}
    if read_only:
        # Read-only transactions go through the read path, which adds its query metadata.
        body |= {"Index": cluster.kv_get_index(), "LastContact": 0, "KnownLeader": True, "ConsistencyLevel": "",
                 "NotModified": False, "Backend": 0, "ResultsFilteredByACLs": False}
    return _json(body, status=409 if errors else 200, meta=read_only)


# ---- snapshot -----------------------------------------------------------------------------------
async def snapshot_save(request: web.Request) -> web.Response:
    """GET /v1/snapshot -> gzip tar archive, X-Consul-Index.
    https://developer.hashicorp.com/consul/api-docs/snapshot#generate-snapshot"""
    body, index = _cluster(request).snapshot_save()
    return web.Response(
        body=body,
        headers={"X-Consul-Index": str(index), "X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0"},
    )


async def snapshot_restore(request: web.Request) -> web.Response:
    """PUT /v1/snapshot with an archive body replaces the state.
    https://developer.hashicorp.com/consul/api-docs/snapshot#restore-snapshot"""
    body = await request.read()
    try:
        _cluster(request).snapshot_restore(body)
    except SnapshotError as exc:
        return web.Response(status=500, text=str(exc))
    return web.Response(status=200)


# ---- catalog / health ------------------------------------------------------------------------
def _tags_ok(tags: list[str], wanted: list[str]) -> bool:
    return all(t in tags for t in wanted)


async def catalog_datacenters(request: web.Request) -> web.Response:
    """GET /v1/catalog/datacenters -- https://developer.hashicorp.com/consul/api-docs/catalog#list-datacenters"""
    return _json([_cluster(request).datacenter])


async def catalog_nodes(request: web.Request) -> web.Response:
    """GET /v1/catalog/nodes -- https://developer.hashicorp.com/consul/api-docs/catalog#list-nodes"""
    cluster = _cluster(request)
    idx = await _blocking(request, lambda: cluster.catalog_index)
    return _json([cluster.node_view(n) for n in cluster.members], index=idx)


async def catalog_services(request: web.Request) -> web.Response:
    """GET /v1/catalog/services -> {name: [tags]} -- https://developer.hashicorp.com/consul/api-docs/catalog#list-services"""
    cluster = _cluster(request)
    idx = await _blocking(request, lambda: cluster.catalog_index)
    out: dict[str, list[str]] = {}
    for _, svc in cluster.all_services():
        tags = out.setdefault(svc["Service"], [])
        tags.extend(t for t in svc["Tags"] if t not in tags)
    return _json(out, index=idx)


async def catalog_service(request: web.Request) -> web.Response:
    """GET /v1/catalog/service/:service[?tag=] -- https://developer.hashicorp.com/consul/api-docs/catalog#list-nodes-for-service"""
    cluster = _cluster(request)
    name = request.match_info["service"]
    wanted = request.query.getall("tag", [])
    idx = await _blocking(request, lambda: cluster.catalog_index)
    out = []
    for node, svc in cluster.all_services():
        if svc["Service"] != name or not _tags_ok(svc["Tags"], wanted):
            continue
        nv = cluster.node_view(node)
        out.append(
            {
                "ID": nv["ID"],
                "Node": nv["Node"],
                "Address": nv["Address"],
                "Datacenter": nv["Datacenter"],
                "TaggedAddresses": nv["TaggedAddresses"],
                "NodeMeta": nv["Meta"],
                "ServiceKind": svc["Kind"],
                "ServiceID": svc["ID"],
                "ServiceName": svc["Service"],
                "ServiceTags": svc["Tags"],
                "ServiceAddress": svc["Address"],
                **({"ServiceTaggedAddresses": svc["TaggedAddresses"]} if svc["TaggedAddresses"] else {}),
                "ServiceWeights": svc["Weights"],
                "ServiceMeta": svc["Meta"],
                "ServicePort": svc["Port"],
                "ServicePorts": None,
                "ServiceSocketPath": "",
                "ServiceEnableTagOverride": svc["EnableTagOverride"],
                "ServiceProxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
                "ServiceConnect": {},
                "ServiceLocality": None,
                "CreateIndex": svc["CreateIndex"],
                "ModifyIndex": svc["ModifyIndex"],
            }
        )
    return _json(out, index=idx)


def _service_body(svc: dict[str, Any]) -> dict[str, Any]:
    # The catalog's NodeService: no Datacenter; Kind and TaggedAddresses are omitted when empty.
    body = {k: v for k, v in svc.items() if k != "Datacenter" and (v or k not in ("Kind", "TaggedAddresses"))}
    body.update({"Proxy": {"Mode": "", "MeshGateway": {}, "Expose": {}}, "Connect": {}, "PeerName": ""})
    return body


async def health_service(request: web.Request) -> web.Response:
    """GET /v1/health/service/:service[?passing][?tag=] -- https://developer.hashicorp.com/consul/api-docs/health#list-service-instances-for-service"""
    cluster = _cluster(request)
    cluster.expire_ttls()
    name = request.match_info["service"]
    wanted = request.query.getall("tag", [])
    passing = _flag(request, "passing")
    idx = await _blocking(request, lambda: cluster.catalog_index)
    out = []
    for node, svc in cluster.all_services():
        if svc["Service"] != name or not _tags_ok(svc["Tags"], wanted):
            continue
        checks = [c for c in cluster.node_checks(node) if c["ServiceID"] in ("", svc["ID"])]
        if passing and any(c["Status"] != "passing" for c in checks):
            continue
        out.append({"Node": cluster.node_view(node), "Service": _service_body(svc), "Checks": checks})
    return _json(out, index=idx)


async def health_checks(request: web.Request) -> web.Response:
    """GET /v1/health/checks/:service -- https://developer.hashicorp.com/consul/api-docs/health#list-checks-for-service"""
    cluster = _cluster(request)
    cluster.expire_ttls()
    name = request.match_info["service"]
    idx = await _blocking(request, lambda: cluster.catalog_index)
    out = [c for n in cluster.members for c in cluster.node_checks(n) if c["ServiceName"] == name]
    return _json(out, index=idx)


async def health_state(request: web.Request) -> web.Response:
    """GET /v1/health/state/:state -- https://developer.hashicorp.com/consul/api-docs/health#list-checks-in-state"""
    cluster = _cluster(request)
    cluster.expire_ttls()
    state = request.match_info["state"]  # an unknown state matches no check: 200 and [], as Consul answers
    idx = await _blocking(request, lambda: cluster.catalog_index)
    out = [
        c for n in cluster.members for c in cluster.node_checks(n) if state == "any" or c["Status"] == state
    ]
    return _json(out, index=idx)


async def health_node(request: web.Request) -> web.Response:
    """GET /v1/health/node/:node -- https://developer.hashicorp.com/consul/api-docs/health#list-checks-for-node"""
    cluster = _cluster(request)
    cluster.expire_ttls()
    node = request.match_info["node"]
    idx = await _blocking(request, lambda: cluster.catalog_index)
    return _json(cluster.node_checks(node) if node in cluster.members else [], index=idx)


# ---- agent ---------------------------------------------------------------------------------------
def _member_view(cluster: ConsulCluster, name: str) -> dict[str, Any]:
    m = cluster.members[name]
    return {
        "Name": m.name,
        "Addr": m.address,
        "Port": 8301,
        "Tags": {
            "acls": "1" if cluster.acl_token else "0",
            "build": f"{CONSUL_VERSION}:c976ffd2",
            "dc": cluster.datacenter,
            "expect": str(len(cluster.members)),
            "ft_fs": "1",
            "ft_si": "1",
            "id": m.node_id,
            "port": m.raft_addr.rsplit(":", 1)[1],
            "raft_vsn": "3",
            "role": "consul",
            "segment": "",
            "vsn": "2",
            "vsn_max": "3",
            "vsn_min": "2",
        },
        "Status": 1,
        "ProtocolMin": 1,
        "ProtocolMax": 5,
        "ProtocolCur": 2,
        "DelegateMin": 2,
        "DelegateMax": 5,
        "DelegateCur": 4,
    }


async def agent_self(request: web.Request) -> web.Response:
    """GET /v1/agent/self -- answered by the server whose listener got the request.
    https://developer.hashicorp.com/consul/api-docs/agent#read-configuration"""
    cluster = _cluster(request)
    name = _server(request)
    m = cluster.members[name]
    is_leader = name == cluster.leader
    checks = cluster.checks[name]
    return _json(
        {
            "Config": {
                "Datacenter": cluster.datacenter,
                "PrimaryDatacenter": cluster.datacenter,
                "NodeName": m.name,
                "NodeID": m.node_id,
                "Revision": "c976ffd2",
                "Server": True,
                "Version": CONSUL_VERSION,
                "BuildDate": "1970-01-01T00:00:01Z",
                "BindAddr": m.address,
            },
            "DebugConfig": {
                "Datacenter": cluster.datacenter,
                "NodeName": m.name,
                "NodeID": m.node_id,
                "ServerMode": True,
                "BootstrapExpect": len(cluster.members),
                "ACLsEnabled": bool(cluster.acl_token),
                "AdvertiseAddrLAN": m.address,
            },
            "Coord": {"Vec": [0.0] * 8, "Error": 1.5, "Adjustment": 0.0, "Height": 1e-05},
            "Member": _member_view(cluster, name),
            "Stats": {
                "agent": {
                    "check_monitors": "0",
                    "check_ttls": str(sum(1 for c in checks.values() if c["Type"] == "ttl")),
                    "checks": str(len(checks)),
                    "services": str(len(cluster.services[name])),
                },
                "build": {"prerelease": "", "revision": "c976ffd2", "version": CONSUL_VERSION, "version_metadata": ""},
                "consul": {
                    "acl": "enabled" if cluster.acl_token else "disabled",
                    "bootstrap": "false",
                    "known_datacenters": "1",
                    "leader": "true" if is_leader else "false",
                    "leader_addr": cluster.members[cluster.leader].raft_addr,
                    "server": "true",
                },
                "raft": {
                    "applied_index": str(cluster.index),
                    "commit_index": str(cluster.index),
                    "fsm_pending": "0",
                    "last_contact": "0" if is_leader else go_duration(cluster.follower_contact_ms()),
                    "last_log_index": str(cluster.index),
                    "last_log_term": str(cluster.term),
                    "last_snapshot_index": "0",
                    "last_snapshot_term": "0",
                    "latest_configuration": "[" + " ".join(
                        f"{{Suffrage:Voter ID:{s.node_id} Address:{s.raft_addr}}}" for s in cluster.members.values()) + "]",
                    "latest_configuration_index": "0",
                    "num_peers": str(len(cluster.members) - 1),
                    "protocol_version": "3",
                    "protocol_version_max": "3",
                    "protocol_version_min": "0",
                    "snapshot_version_max": "1",
                    "snapshot_version_min": "0",
                    "state": "Leader" if is_leader else "Follower",
                    "term": str(cluster.term),
                },
            },
            "Meta": {"consul-network-segment": ""},
        }
    )


async def agent_members(request: web.Request) -> web.Response:
    """GET /v1/agent/members -- https://developer.hashicorp.com/consul/api-docs/agent#list-members"""
    cluster = _cluster(request)
    return _json([_member_view(cluster, n) for n in cluster.members])


def _agent_service(svc: dict[str, Any]) -> dict[str, Any]:
    # Kind and TaggedAddresses are omitted when empty, as the agent's JSON does.
    return {k: v for k, v in svc.items()
            if k not in ("CreateIndex", "ModifyIndex") and (v or k not in ("Kind", "TaggedAddresses"))}


async def agent_services(request: web.Request) -> web.Response:
    """GET /v1/agent/services -- https://developer.hashicorp.com/consul/api-docs/agent/service#list-services"""
    cluster = _cluster(request)
    return _json({sid: _agent_service(s) for sid, s in cluster.services[_server(request)].items()})


async def agent_service(request: web.Request) -> web.Response:
    """GET /v1/agent/service/:service_id -- https://developer.hashicorp.com/consul/api-docs/agent/service#get-service-configuration"""
    cluster = _cluster(request)
    sid = request.match_info["service_id"]
    svc = cluster.services[_server(request)].get(sid)
    if svc is None:
        raise NotFoundError(f"unknown service ID: {sid}")
    view = _agent_service(svc)
    # The agent's hash of the registration, for blocking on it (?hash=): 16 hex digits.
    view["ContentHash"] = hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]
    return _json(view)


async def agent_service_register(request: web.Request) -> web.Response:
    """PUT /v1/agent/service/register[?replace-existing-checks] -- https://developer.hashicorp.com/consul/api-docs/agent/service#register-service"""
    cluster = _cluster(request)
    body = await _read_json(request)
    try:
        cluster.register_service(_server(request), body, _flag(request, "replace-existing-checks"))
    except (ValueError, LookupError) as exc:
        raise BadRequest(f"Invalid Service Meta: {exc}" if "Meta" in str(exc) else str(exc)) from exc
    return web.Response(status=200)


async def agent_service_deregister(request: web.Request) -> web.Response:
    """PUT /v1/agent/service/deregister/:service_id -- https://developer.hashicorp.com/consul/api-docs/agent/service#deregister-service"""
    sid = request.match_info["service_id"]
    if not _cluster(request).deregister_service(_server(request), sid):
        raise NotFoundError(f'Unknown service ID "{sid}". Ensure that the service ID is passed, not the service name.')
    return web.Response(status=200)


async def agent_checks(request: web.Request) -> web.Response:
    """GET /v1/agent/checks -- https://developer.hashicorp.com/consul/api-docs/agent/check#list-checks"""
    cluster = _cluster(request)
    cluster.expire_ttls()
    return _json({cid: public_check(c, agent=True) for cid, c in cluster.checks[_server(request)].items()})


async def agent_check_register(request: web.Request) -> web.Response:
    """PUT /v1/agent/check/register -- https://developer.hashicorp.com/consul/api-docs/agent/check#register-check"""
    body = await _read_json(request)
    try:
        _cluster(request).register_check(_server(request), body)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    except LookupError as exc:  # an unknown ServiceID: 404, as Consul answers
        raise NotFoundError(str(exc)) from exc
    return web.Response(status=200)


async def agent_check_deregister(request: web.Request) -> web.Response:
    """PUT /v1/agent/check/deregister/:check_id -- https://developer.hashicorp.com/consul/api-docs/agent/check#deregister-check"""
    cid = request.match_info["check_id"]
    if not _cluster(request).deregister_check(_server(request), cid):
        raise NotFoundError(f'Unknown check ID "{cid}". Ensure that the check ID is passed, not the check name.')
    return web.Response(status=200)


def _ttl_update(request: web.Request, status: str, output: str | None) -> web.Response:
    try:
        _cluster(request).update_check(_server(request), request.match_info["check_id"], status, output)
    except LookupError as exc:
        raise NotFoundError(str(exc)) from exc
    return web.Response(status=200)


async def agent_check_pass(request: web.Request) -> web.Response:
    """PUT /v1/agent/check/pass/:check_id[?note=] -- https://developer.hashicorp.com/consul/api-docs/agent/check#ttl-check-pass"""
    return _ttl_update(request, "passing", request.query.get("note"))


async def agent_check_warn(request: web.Request) -> web.Response:
    """PUT /v1/agent/check/warn/:check_id[?note=] -- https://developer.hashicorp.com/consul/api-docs/agent/check#ttl-check-warn"""
    return _ttl_update(request, "warning", request.query.get("note"))


async def agent_check_fail(request: web.Request) -> web.Response:
    """PUT /v1/agent/check/fail/:check_id[?note=] -- https://developer.hashicorp.com/consul/api-docs/agent/check#ttl-check-fail"""
    return _ttl_update(request, "critical", request.query.get("note"))


async def agent_check_update(request: web.Request) -> web.Response:
    """PUT /v1/agent/check/update/:check_id {"Status","Output"} -- https://developer.hashicorp.com/consul/api-docs/agent/check#ttl-check-update"""
    body = await _read_json(request)
    status = ci_get(body, "Status")
    if status not in ("passing", "warning", "critical"):
        raise BadRequest("Invalid check status")
    return _ttl_update(request, status, ci_get(body, "Output"))


async def agent_metrics(request: web.Request) -> web.Response:
    """GET /v1/agent/metrics[?format=prometheus] -- this listener's server's telemetry.
    https://developer.hashicorp.com/consul/api-docs/agent#view-metrics"""
    cluster = _cluster(request)
    series = cluster.metric_series(_server(request))
    if request.query.get("format") == "prometheus":
        return web.Response(text=render(series), content_type="text/plain", charset="utf-8",
                            headers={"X-Consul-Metrics-Format": "prometheus-0.0.4"})
    gauges, samples = [], []
    for s in series:
        dotted = JSON_NAMES.get(s.name, s.name)
        if s.kind == "summary":
            q = s.quantiles or {}
            samples.append(
                {
                    "Name": dotted, "Count": s.count, "Sum": s.total,
                    "Min": q.get(0.5, 0.0), "Max": q.get(0.99, 0.0), "Mean": q.get(0.5, 0.0),
                    "Rate": s.total / 10.0, "Stddev": 0.0, "Labels": dict(s.labels),
                }
            )
        else:
            gauges.append({"Name": dotted, "Value": s.value, "Labels": dict(s.labels)})
    stamp = time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(cluster.clock.time()))
    return _json({"Timestamp": stamp, "Gauges": gauges, "Points": [], "Counters": [], "Samples": samples})


async def _read_json(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        raise BadRequest("Request decode failed: EOF")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"Request decode failed: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("Request decode failed: expected an object")
    return data


# ---- lab fault injection (NOT part of the Consul API) -----------------------------------------
async def lab_faults_get(request: web.Request) -> web.Response:
    """GET /_lab/faults -- lab-only admin view of injected faults and model inputs."""
    return _json(_cluster(request).faults())


async def lab_faults_post(request: web.Request) -> web.Response:
    """POST /_lab/faults {"fault": consul-contention|slow-leader|background-load|clear, ...} -- lab-only."""
    cluster = _cluster(request)
    body = await _read_json(request)
    fault = body.get("fault")
    if fault == "consul-contention":
        cluster.fault_contention(body.get("background_rps"))
    elif fault == "slow-leader":
        server = body.get("server") or cluster.leader
        if server not in cluster.members:
            raise BadRequest(f"unknown server {server!r}")
        cluster.fault_slow_leader(server)
    elif fault == "background-load":
        cluster.set_background(float(body.get("rps", 0)))
    elif fault == "clear":
        cluster.clear_faults()
    else:
        raise BadRequest(f"unknown fault {fault!r}")
    return _json(cluster.faults())


async def lab_faults_delete(request: web.Request) -> web.Response:
    """DELETE /_lab/faults -- lab-only: clear every fault."""
    cluster = _cluster(request)
    cluster.clear_faults()
    return _json(cluster.faults())


# ---- app wiring ----------------------------------------------------------------------------------
async def housekeeping(cluster: ConsulCluster, period: float = 1.0) -> None:
    """TTL expiry and debounced state flushes; runs once per cluster."""
    try:
        while True:
            await asyncio.sleep(period)
            cluster.expire_ttls()
            cluster.save_state()
    finally:
        cluster.save_state()


def read_agent_config(config_dir: Path) -> dict[str, bool]:
    """A client agent's streaming setting from its config directory's JSON files, in name order as Consul
    merges them (absent: Consul's default, on)."""
    use = True
    for path in sorted(config_dir.glob("*.json")) if config_dir.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("use_streaming_backend"), bool):
            use = data["use_streaming_backend"]
    return {"use_streaming_backend": use}


async def client_agent_self(request: web.Request) -> web.Response:
    """GET /v1/agent/self of a client agent: its own node and its streaming setting as last loaded."""
    cluster = _cluster(request)
    name = _server(request)
    setting = cluster.client_streaming[name]
    return _json({
        "Config": {"Datacenter": cluster.datacenter, "NodeName": name, "Server": False, "Version": CONSUL_VERSION},
        "DebugConfig": {"Datacenter": cluster.datacenter, "NodeName": name, "ServerMode": False,
                        "UseStreamingBackend": setting, "RPCConfig": {"EnableStreaming": False}},
    })


def make_client_app(cluster: ConsulCluster, name: str) -> web.Application:
    """A client agent's listener: /v1/agent/self (its setting) and the status endpoints; the rest of the
    API is the servers' (the lab's clients talk to them directly)."""
    app = web.Application(middlewares=[consul_middleware])
    app[CLUSTER] = cluster
    app[SERVER] = name
    app[LABEL] = f"consul client agent {name}"
    app.router.add_get("/v1/agent/self", client_agent_self)
    app.router.add_get("/v1/status/leader", status_leader)
    return app


def make_app(cluster: ConsulCluster, server: str, run_housekeeping: bool = False) -> web.Application:
    app = web.Application(middlewares=[consul_middleware], client_max_size=64 * 1024 * 1024)
    app[CLUSTER] = cluster
    app[SERVER] = server
    app[LABEL] = f"consul server {server}"
    r = app.router
    r.add_get("/v1/status/leader", status_leader)
    r.add_get("/v1/status/peers", status_peers)
    r.add_get("/v1/operator/raft/configuration", raft_configuration)
    r.add_post("/v1/operator/raft/transfer-leader", raft_transfer_leader)
    r.add_get("/v1/operator/autopilot/health", autopilot_health)
    r.add_get("/v1/operator/autopilot/configuration", autopilot_configuration)
    r.add_get("/v1/kv/{key:.*}", kv_get)
    r.add_put("/v1/kv/{key:.*}", kv_put)
    r.add_delete("/v1/kv/{key:.*}", kv_delete)
    r.add_put("/v1/txn", txn)
    r.add_get("/v1/snapshot", snapshot_save)
    r.add_put("/v1/snapshot", snapshot_restore)
    r.add_get("/v1/catalog/datacenters", catalog_datacenters)
    r.add_get("/v1/catalog/nodes", catalog_nodes)
    r.add_get("/v1/catalog/services", catalog_services)
    r.add_get("/v1/catalog/service/{service}", catalog_service)
    r.add_get("/v1/health/service/{service}", health_service)
    r.add_get("/v1/health/checks/{service}", health_checks)
    r.add_get("/v1/health/state/{state}", health_state)
    r.add_get("/v1/health/node/{node}", health_node)
    r.add_get("/v1/agent/self", agent_self)
    r.add_get("/v1/agent/members", agent_members)
    r.add_get("/v1/agent/metrics", agent_metrics)
    r.add_get("/v1/agent/services", agent_services)
    r.add_get("/v1/agent/service/{service_id}", agent_service)
    r.add_put("/v1/agent/service/register", agent_service_register)
    r.add_put("/v1/agent/service/deregister/{service_id}", agent_service_deregister)
    r.add_get("/v1/agent/checks", agent_checks)
    r.add_put("/v1/agent/check/register", agent_check_register)
    r.add_put("/v1/agent/check/deregister/{check_id}", agent_check_deregister)
    r.add_put("/v1/agent/check/pass/{check_id}", agent_check_pass)
    r.add_put("/v1/agent/check/warn/{check_id}", agent_check_warn)
    r.add_put("/v1/agent/check/fail/{check_id}", agent_check_fail)
    r.add_put("/v1/agent/check/update/{check_id}", agent_check_update)
    r.add_get("/_lab/faults", lab_faults_get)
    r.add_post("/_lab/faults", lab_faults_post)
    r.add_delete("/_lab/faults", lab_faults_delete)
    if run_housekeeping:

        async def _ctx(app: web.Application):
            task = asyncio.create_task(housekeeping(cluster))
            yield
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

        app.cleanup_ctx.append(_ctx)
    return app


def raft_addresses(hosts: list[str]) -> list[str]:
    # Real servers use :8300 on distinct hosts; same-host test clusters need distinct ports.
    if len(set(hosts)) == len(hosts):
        return [f"{h}:8300" for h in hosts]
    return [f"{h}:{8300 + i}" for i, h in enumerate(hosts)]


def build_cluster(
    names_hosts: list[tuple[str, str]], **kwargs: Any
) -> ConsulCluster:
    hosts = [h for _, h in names_hosts]
    raft = raft_addresses(hosts)
    return ConsulCluster([(n, h, r) for (n, h), r in zip(names_hosts, raft, strict=True)], **kwargs)


def run(
    servers_at: list[tuple[str, ListenSpec]], listen: list[ListenSpec], *, servers: int = 3, datacenter: str = "dc1",
    acl_token: str | None = None, state_dir: Path | None = None, streaming_key: str = STREAMING_KEY, seed: int = 0,
    clients: list[tuple[str, ListenSpec, Path]] | None = None,
) -> None:
    """Serve a cluster of at least `servers` servers until SIGTERM: one listener per (name, address) in
    `servers_at` (the others listen nowhere), and each of `listen` answering as the first server. Each of
    `clients` (name, address, config dir) is a client agent whose streaming setting is read from its config
    directory at start and again on SIGHUP (its reload); streaming load needs a client that streams."""
    specs: list[tuple[str, ListenSpec | None]] = list(servers_at)
    names = {n for n, _ in specs}
    i = 1
    while len(specs) < servers:
        name = f"consul{i}"
        i += 1
        if name not in names:
            specs.append((name, None))
            names.add(name)
    hosts = [spec.host if spec else f"127.0.0.{k + 1}" for k, (_, spec) in enumerate(specs)]
    cluster = build_cluster(
        [(n, h) for (n, _), h in zip(specs, hosts, strict=True)],
        datacenter=datacenter,
        acl_token=acl_token,
        state_dir=state_dir,
        streaming_key=streaming_key,
        seed=seed,
        params=LoadParams(),
    )
    # Bind every socket (entering netns as needed) before the loop exists.
    pairs = []
    first = specs[0][0]
    for name, spec in specs:
        if spec is not None:
            pairs.append((name, bind_socket(spec)))
    for spec in listen:
        pairs.append((first, bind_socket(spec)))
    apps = [(make_app(cluster, name, run_housekeeping=(k == 0)), sock) for k, (name, sock) in enumerate(pairs)]
    dirs = {name: config_dir for name, _, config_dir in clients or []}

    def reload() -> None:
        cluster.synthesize()  # the load so far at the old setting
        cluster.client_streaming = {name: read_agent_config(d)["use_streaming_backend"] for name, d in dirs.items()}

    reload()
    apps += [(make_client_app(cluster, name), bind_socket(spec)) for name, spec, _ in clients or []]

    async def serve() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
        await serve_forever(apps)

    asyncio.run(serve())
