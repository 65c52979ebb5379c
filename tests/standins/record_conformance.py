"""Record the stand-ins' conformance reference from the real Consul and Nomad agents.

Run with the real binaries first on PATH (CI unpacks them in .cache/hashistack):

    PATH=.cache/hashistack:$PATH .venv/bin/python -m tests.standins.record_conformance

It starts a LocalStack (3 Consul servers with ACLs on, default deny; a Nomad server with 3 raw_exec clients
cache1..cache3, the stand-ins' topology), plays the fixed scenarios below against it and writes, for every
request, the method, the route pattern, the request, the status code, the protocol headers present and the
*shape* of the answer (keys and value types, recursively; no values, so indexes, IDs, timestamps and
addresses drop out) to tests/standins/recordings/{consul,nomad}.json. tests/standins/test_conformance.py
replays the same scenarios against the stand-ins and compares.

Re-record when a stand-in gains a route (the route guard in test_conformance.py fails until the scenario
here exercises it) or when the lab moves to a new Consul or Nomad release.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "CONSUL_TOKEN", "RECORDINGS", "Session", "Volatile", "consul_scenario", "merge", "nomad_scenario", "shape",
]

RECORDINGS = Path(__file__).with_name("recordings")
CONSUL_TOKEN = "conformance-management-token"
FORMAT = 1

# ---- answer shapes ---------------------------------------------------------------------------------------
# A shape is "null" | "bool" | "number" | "string" (JSON scalars; Go writes 1.0 as 1, so ints and floats are
# one kind), [] (an empty list), [shape] (a list; the merge of its items' shapes), {key: shape} (an object),
# {"$map": shape} (a free-form map whose keys are data: node attributes, metadata, metric labels), or
# {"$anyOf": [shape, ...]} (one per kind, when a value's kind varies, e.g. a null or a string).

# Objects whose keys are data, not fields: only the shape of their values is recorded.
FREE_MAPS = frozenset({"Attributes", "Meta", "NodeMeta", "ServiceMeta", "Labels", "Links", "Details"})
_UUID_TEXT = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UUID = re.compile(f"^{_UUID_TEXT}$", re.IGNORECASE)
_ADDR = re.compile(r"^\[?[0-9a-f.:]+\]?(:\d+)?$", re.IGNORECASE)


def _norm_key(key: str) -> str:
    """Map keys that are volatile values (IDs, addresses, indexes) become placeholders."""
    if _UUID.match(key):
        return "<uuid>"
    if key.isdigit():
        return "<n>"
    if _ADDR.match(key) and any(c.isdigit() for c in key):
        return "<addr>"
    return key


def _kind(s: Any) -> str:
    if isinstance(s, str):
        return s
    if isinstance(s, list):
        return "list"
    if "$map" in s:
        return "map"
    if "$anyOf" in s:
        return "anyOf"
    return "object"


def shape(value: Any, key: str | None = None) -> Any:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        out: Any = None
        for item in value:
            out = shape(item) if out is None else merge(out, shape(item))
        return [] if out is None else [out]
    if isinstance(value, dict):
        if key in FREE_MAPS:
            inner: Any = None
            for v in value.values():
                inner = shape(v) if inner is None else merge(inner, shape(v))
            return {"$map": inner if inner is not None else "empty"}
        obj: dict[str, Any] = {}
        for k, v in value.items():
            nk, sv = _norm_key(k), shape(v, k)
            obj[nk] = merge(obj[nk], sv) if nk in obj else sv
        return dict(sorted(obj.items()))
    raise TypeError(f"not JSON: {type(value).__name__}")


def _members(s: Any) -> list[Any]:
    return list(s["$anyOf"]) if isinstance(s, dict) and "$anyOf" in s else [s]


def merge(a: Any, b: Any) -> Any:
    """The shape of a value that is sometimes like `a`, sometimes like `b` (list items, map values)."""
    if a == b:
        return a
    by_kind: dict[str, Any] = {}
    for s in _members(a) + _members(b):
        k = _kind(s)
        if k not in by_kind:
            by_kind[k] = s
            continue
        have = by_kind[k]
        if k == "list":
            by_kind[k] = (have or s) if not (have and s) else [merge(have[0], s[0])]
        elif k == "map":
            x, y = have["$map"], s["$map"]
            by_kind[k] = {"$map": y if x == "empty" else x if y == "empty" else merge(x, y)}
        elif k == "object":
            obj = dict(have)
            for key, sub in s.items():
                obj[key] = merge(obj[key], sub) if key in obj else sub
            by_kind[k] = dict(sorted(obj.items()))
    if len(by_kind) == 1:
        return next(iter(by_kind.values()))
    order = ("null", "bool", "number", "string", "list", "map", "object")
    return {"$anyOf": [by_kind[k] for k in order if k in by_kind]}


# ---- the recording client ------------------------------------------------------------------------------
PROTOCOL_HEADERS = ("X-Consul-Index", "X-Consul-KnownLeader", "X-Consul-LastContact",
                    "X-Nomad-Index", "X-Nomad-KnownLeader", "X-Nomad-LastContact")


class Volatile(str):
    """A query value taken from an earlier answer (an index, an ID prefix): recorded as "<volatile>"."""


def _norm_value(text: str) -> str:
    return "<uuid>" if _UUID.match(text) else text


def _norm_body(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _norm_body(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm_body(v) for v in value]
    if isinstance(value, str):
        return _norm_value(value)
    return value


def answer(resp: httpx.Response) -> Any:
    """The shape of a response body: a JSON shape, or what kind of non-JSON body it is."""
    if not resp.content:
        return "$empty"
    ctype = resp.headers.get("content-type", "").split(";")[0].strip()
    if "json" in ctype:
        return shape(resp.json())
    try:
        resp.content.decode("utf-8")
    except UnicodeDecodeError:
        return "$binary"
    return f"$text {ctype or '-'}"


@dataclass
class Session:
    """Plays one scenario against one agent (or stand-in) and records every exchange it keeps."""

    base_urls: list[str]
    token: str | None = None
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))

    def send(self, method: str, route: str, *, server: int = 0, params: list[tuple[str, str]] | None = None,
             body: Any = None, content: bytes | None = None, token: str | None = "default",
             **path: str) -> httpx.Response:
        headers = {}
        token = self.token if token == "default" else token
        if token:
            headers["X-Consul-Token"] = token
        url = self.base_urls[server] + route.format(**path)
        return self.client.request(method, url, params=params, json=body, content=content, headers=headers)

    def call(self, method: str, route: str, *, server: int = 0, params: list[tuple[str, str]] | None = None,
             body: Any = None, content: bytes | None = None, token: str | None = "default",
             until: Callable[[httpx.Response], object] | None = None, timeout: float = 90.0,
             record: bool = True, **path: str) -> httpx.Response:
        """One request, recorded (unless `record` is false: an answer whose shape is a race on the agent).
        With `until`, repeat it (unrecorded) until `until(response)` holds, then record the response that
        passed: the agents converge at their own pace, the stand-ins at theirs."""
        deadline = time.monotonic() + timeout
        while True:
            resp = self.send(method, route, server=server, params=params, body=body, content=content,
                             token=token, **path)
            if until is None:
                break
            try:
                if until(resp):
                    break
            except (ValueError, KeyError, IndexError, TypeError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method} {route.format(**path)}: still {resp.status_code} {resp.text[:300]}")
            time.sleep(0.2)
        if record:
            self.exchanges.append(self._record(method, route, server, params, body, content, token, path, resp))
        return resp

    def _record(self, method, route, server, params, body, content, token, path, resp) -> dict[str, Any]:
        request: dict[str, Any] = {"path": _norm_value_path(route.format(**path))}
        if server:
            request["server"] = server
        if params:
            request["query"] = [[k, "<volatile>" if isinstance(v, Volatile) else _norm_value(v)] for k, v in params]
        if body is not None:
            request["body"] = _norm_body(body)
        if content is not None:
            request["body"] = "<bytes>" if content else "<empty>"
        if self.token is not None and token != self.token:
            request["token"] = "none" if token is None else "other"
        present = [h for h in PROTOCOL_HEADERS if h in resp.headers]
        out = {"method": method, "route": _canonical(route), "request": request, "status": resp.status_code,
               "headers": present, "answer": answer(resp)}
        if resp.status_code >= 400 and str(out["answer"]).startswith("$text"):
            out["text"] = _norm_text(resp.text)  # for whoever reads a diff; not compared
        return out


def _norm_text(text: str) -> str:
    text = text.strip().removeprefix("rpc error making call: ")  # a follower forwards to the leader
    text = re.sub(_UUID_TEXT, "<uuid>", text, flags=re.IGNORECASE)
    return re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "<addr>", text)[:200]


def _norm_value_path(path: str) -> str:
    return "/".join(_norm_value(part) for part in path.split("/"))


def _canonical(route: str) -> str:
    """The route as aiohttp's router names it: `{key:.*}` and `{key}` both read `{key}`."""
    return re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", route)


# ---- the Consul scenario -------------------------------------------------------------------------------
def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def consul_scenario(s: Session, node: str = "consul1") -> None:
    """KV (CAS, recurse, keys, raw, blocking), transactions, an agent service with an HTTP check and a TTL
    check, catalog and health reads, ACL refusals, snapshots, operator raft/autopilot, agent self/members/
    metrics, and a leadership transfer. `node` is the node name of the agent at base_urls[0]."""
    # Status needs no token; everything else does (ACLs on, default deny).
    s.call("GET", "/v1/status/leader", token=None, until=lambda r: r.json())
    s.call("GET", "/v1/status/peers", token=None)
    # A fresh cluster's catalog settles: every server's node with its tagged addresses.
    s.call("GET", "/v1/catalog/nodes", until=lambda r: len(r.json()) == 3 and all(n["TaggedAddresses"] for n in r.json()))
    s.call("GET", "/v1/agent/self", token=None)
    s.call("GET", "/v1/agent/self", token="not-a-known-token")
    s.call("GET", "/v1/kv/{key}", token=None, key="conf/a")

    # KV
    s.call("GET", "/v1/kv/{key}", key="conf/a")  # absent: 404
    s.call("PUT", "/v1/kv/{key}", key="conf/a", content=b"one")
    s.call("PUT", "/v1/kv/{key}", key="conf/b", params=[("flags", "42")], content=b"two")
    s.call("PUT", "/v1/kv/{key}", key="conf/dir/c", content=b"three")
    s.call("PUT", "/v1/kv/{key}", key="conf/empty")
    entry = s.call("GET", "/v1/kv/{key}", key="conf/a").json()[0]
    s.call("GET", "/v1/kv/{key}", key="conf/a", params=[("raw", "")])
    s.call("GET", "/v1/kv/{key}", key="conf/empty")
    s.call("GET", "/v1/kv/{key}", key="conf/", params=[("recurse", "")])
    s.call("GET", "/v1/kv/{key}", key="conf/", params=[("keys", ""), ("separator", "/")])
    s.call("GET", "/v1/kv/{key}", key="conf/nothing/", params=[("recurse", "")])
    s.call("GET", "/v1/kv/{key}", key="", params=[("recurse", "")])
    idx = Volatile(entry["ModifyIndex"])
    s.call("GET", "/v1/kv/{key}", key="conf/a", params=[("index", idx), ("wait", "100ms")])
    s.call("PUT", "/v1/kv/{key}", key="conf/a", params=[("cas", "0")], content=b"not-created")
    s.call("PUT", "/v1/kv/{key}", key="conf/a", params=[("cas", idx)], content=b"one-again")
    s.call("PUT", "/v1/kv/{key}", key="conf/a", params=[("cas", idx)], content=b"stale")
    b = s.call("GET", "/v1/kv/{key}", key="conf/b").json()[0]
    s.call("DELETE", "/v1/kv/{key}", key="conf/b", params=[("cas", Volatile(b["ModifyIndex"] + 1000))])
    s.call("DELETE", "/v1/kv/{key}", key="conf/b", params=[("cas", Volatile(b["ModifyIndex"]))])
    s.call("DELETE", "/v1/kv/{key}", key="conf/never-was")
    s.call("PUT", "/v1/kv/{key}", key="", content=b"x")  # no key: 400

    # Transactions: a write, a read-only one, a failing one.
    s.call("PUT", "/v1/txn", body=[
        {"KV": {"Verb": "set", "Key": "conf/txn/x", "Value": _b64("1")}},
        {"KV": {"Verb": "get", "Key": "conf/a"}},
    ])
    s.call("PUT", "/v1/txn", body=[{"KV": {"Verb": "get", "Key": "conf/txn/x"}}])
    s.call("PUT", "/v1/txn", body=[
        {"KV": {"Verb": "check-index", "Key": "conf/txn/x", "Index": 1}},
        {"KV": {"Verb": "set", "Key": "conf/txn/y", "Value": _b64("2")}},
    ])
    s.call("PUT", "/v1/txn", content=b"{not json")
    s.call("DELETE", "/v1/kv/{key}", key="conf/", params=[("recurse", "")])
    s.call("GET", "/v1/kv/{key}", key="conf/", params=[("recurse", "")])

    # An agent service with an HTTP check (on a port nothing listens on: critical) and a TTL check.
    s.call("PUT", "/v1/agent/service/register", body={
        "ID": "conf-web-1", "Name": "conf-web", "Tags": ["v1", "primary"], "Port": 18080,
        "Meta": {"version": "1"},
        "Check": {"HTTP": "http://127.0.0.1:1/health", "Interval": "10s", "Timeout": "1s"},
    })
    s.call("PUT", "/v1/agent/service/register", body={"Tags": ["no-name"]})  # 400
    s.call("PUT", "/v1/agent/check/register", body={
        "ID": "conf-web-ttl", "Name": "conf web ttl", "ServiceID": "conf-web-1", "TTL": "60s",
    })
    s.call("PUT", "/v1/agent/check/register", body={"Name": "orphan", "ServiceID": "no-such", "TTL": "5s"})
    s.call("PUT", "/v1/agent/check/register", body={"Name": "bad", "HTTP": "http://127.0.0.1:1/"})  # no Interval
    s.call("PUT", "/v1/agent/check/pass/{check_id}", check_id="conf-web-ttl", params=[("note", "ok")])
    s.call("PUT", "/v1/agent/check/warn/{check_id}", check_id="conf-web-ttl", params=[("note", "hmm")])
    s.call("PUT", "/v1/agent/check/fail/{check_id}", check_id="conf-web-ttl", params=[("note", "down")])
    s.call("PUT", "/v1/agent/check/update/{check_id}", check_id="conf-web-ttl",
           body={"Status": "passing", "Output": "fine"})
    s.call("PUT", "/v1/agent/check/update/{check_id}", check_id="conf-web-ttl", body={"Status": "bogus"})
    s.call("PUT", "/v1/agent/check/pass/{check_id}", check_id="no-such-check")
    s.call("PUT", "/v1/agent/check/pass/{check_id}", check_id="service:conf-web-1")  # not a TTL check
    s.call("GET", "/v1/agent/services")
    s.call("GET", "/v1/agent/service/{service_id}", service_id="conf-web-1")
    s.call("GET", "/v1/agent/service/{service_id}", service_id="no-such-service")
    s.call("GET", "/v1/agent/checks")

    # Catalog and health: the agent syncs its services to the catalog (anti-entropy) on its own time.
    s.call("GET", "/v1/catalog/service/{service}", service="conf-web", until=lambda r: len(r.json()) == 1)
    s.call("GET", "/v1/health/checks/{service}", service="conf-web",
           until=lambda r: {c["CheckID"]: c["Status"] for c in r.json()}.get("conf-web-ttl") == "passing")
    s.call("GET", "/v1/catalog/datacenters")
    s.call("GET", "/v1/catalog/nodes")
    s.call("GET", "/v1/catalog/services")
    s.call("GET", "/v1/catalog/service/{service}", service="conf-web", params=[("tag", "v1")])
    s.call("GET", "/v1/catalog/service/{service}", service="conf-web", params=[("tag", "nope")])
    s.call("GET", "/v1/catalog/service/{service}", service="consul")
    s.call("GET", "/v1/health/service/{service}", service="conf-web")
    s.call("GET", "/v1/health/service/{service}", service="conf-web", params=[("passing", "")])
    s.call("GET", "/v1/health/service/{service}", service="no-such-service")
    s.call("GET", "/v1/health/state/{state}", state="critical")
    s.call("GET", "/v1/health/state/{state}", state="passing")
    s.call("GET", "/v1/health/state/{state}", state="any")
    s.call("GET", "/v1/health/state/{state}", state="sideways")  # 400
    s.call("GET", "/v1/health/node/{node}", node=node)
    s.call("GET", "/v1/health/node/{node}", node="no-such-node")
    s.call("PUT", "/v1/agent/check/deregister/{check_id}", check_id="conf-web-ttl")
    s.call("PUT", "/v1/agent/check/deregister/{check_id}", check_id="conf-web-ttl")  # gone: 404
    s.call("PUT", "/v1/agent/service/deregister/{service_id}", service_id="conf-web-1")
    s.call("PUT", "/v1/agent/service/deregister/{service_id}", service_id="conf-web-1")  # gone: 404
    s.call("GET", "/v1/agent/checks")

    # Operator, agent, metrics.
    s.call("GET", "/v1/operator/raft/configuration")
    s.call("GET", "/v1/operator/autopilot/configuration")
    s.call("GET", "/v1/operator/autopilot/health", until=lambda r: r.json()["Healthy"])
    s.call("GET", "/v1/agent/self")
    s.call("GET", "/v1/agent/members")
    # The agent's JSON metrics fail (500, "json: unsupported value: NaN") while a summary has no samples in its
    # interval yet; its next interval has them.
    s.call("GET", "/v1/agent/metrics", until=lambda r: r.status_code == 200, timeout=60)
    s.call("GET", "/v1/agent/metrics", params=[("format", "prometheus")])
    s.call("GET", "/v1/catalog/nodes", params=[("dc", "dc-nowhere")])

    # Snapshot: save, then restore what was saved.
    snap = s.call("GET", "/v1/snapshot")
    s.call("PUT", "/v1/snapshot", content=snap.content)
    s.call("PUT", "/v1/snapshot", content=b"not an archive")
    s.call("GET", "/v1/status/leader", token=None, until=lambda r: r.json())

    # Leadership transfer, last: the cluster then elects and settles.
    s.call("POST", "/v1/operator/raft/transfer-leader")
    s.call("POST", "/v1/operator/raft/transfer-leader", params=[("id", "00000000-0000-0000-0000-000000000000")])
    s.call("GET", "/v1/status/leader", token=None, until=lambda r: r.json())


# ---- the Nomad scenario --------------------------------------------------------------------------------
S = 1_000_000_000


def conf_job(args: list[str], min_healthy_s: int, count: int = 2) -> dict[str, Any]:
    return {"Job": {
        "ID": "conf", "Name": "conf", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "cache", "Count": count,
            "Update": {"MaxParallel": 2, "MinHealthyTime": min_healthy_s * S, "HealthyDeadline": 120 * S,
                       "ProgressDeadline": 300 * S, "AutoRevert": False, "HealthCheck": "task_states"},
            "ReschedulePolicy": {"Delay": 5 * S, "DelayFunction": "constant", "Unlimited": True},
            "Tasks": [{"Name": "redis", "Driver": "raw_exec", "KillTimeout": 2 * S,
                       "Config": {"command": "/bin/sleep", "args": args},
                       "Resources": {"CPU": 20, "MemoryMB": 16}}],
        }],
    }}


def _status(dep: httpx.Response, *wanted: str) -> bool:
    return bool(dep.json()) and dep.json()["Status"] in wanted


def nomad_scenario(s: Session) -> None:
    """Nodes, a service job (register through each route, read every view, a deployment paused, resumed and
    failed, scale, stop allocations, stop and purge), node eligibility and drain, evaluations, metrics."""
    s.call("GET", "/v1/status/leader")
    s.call("GET", "/v1/agent/self")
    nodes = s.call("GET", "/v1/nodes", until=lambda r: sorted(n["Name"] for n in r.json() if n["Status"] == "ready")
                   == ["cache1", "cache2", "cache3"]).json()
    by_name = {n["Name"]: n["ID"] for n in nodes}
    s.call("GET", "/v1/nodes", params=[("prefix", Volatile(by_name["cache1"][:4]))])
    s.call("GET", "/v1/node/{node_id}", node_id=by_name["cache1"])
    s.call("GET", "/v1/node/{node_id}", node_id="00000000-0000-0000-0000-000000000000")
    s.call("GET", "/v1/jobs")
    s.call("GET", "/v1/job/{job_id}", job_id="conf")  # absent: 404

    # v0 through POST /v1/jobs, healthy after 1 s.
    reg = s.call("POST", "/v1/jobs", body=conf_job(["300"], 1)).json()
    s.call("POST", "/v1/jobs", body={"Job": None})  # 400
    dep = s.call("GET", "/v1/job/{job_id}/deployment", job_id="conf",
                 until=lambda r: _status(r, "successful")).json()
    allocs = s.call("GET", "/v1/job/{job_id}/allocations", job_id="conf",
                    until=lambda r: sorted(a["ClientStatus"] for a in r.json()) == ["running", "running"]).json()
    s.call("GET", "/v1/jobs")
    s.call("GET", "/v1/jobs", params=[("prefix", "con")])
    s.call("GET", "/v1/job/{job_id}", job_id="conf")
    s.call("GET", "/v1/job/{job_id}/versions", job_id="conf")
    s.call("GET", "/v1/job/{job_id}/evaluations", job_id="conf")
    s.call("GET", "/v1/job/{job_id}/summary", job_id="conf")
    s.call("GET", "/v1/job/{job_id}/scale", job_id="conf")
    s.call("GET", "/v1/job/{job_id}/deployments", job_id="conf")
    s.call("GET", "/v1/deployments")
    s.call("GET", "/v1/deployment/{deployment_id}", deployment_id=dep["ID"])
    s.call("GET", "/v1/deployment/allocations/{deployment_id}", deployment_id=dep["ID"])
    s.call("GET", "/v1/deployment/{deployment_id}", deployment_id="00000000-0000-0000-0000-000000000000")
    s.call("GET", "/v1/allocations")
    s.call("GET", "/v1/allocation/{alloc_id}", alloc_id=allocs[0]["ID"])
    s.call("GET", "/v1/allocation/{alloc_id}", alloc_id="00000000-0000-0000-0000-000000000000")
    s.call("GET", "/v1/node/{node_id}/allocations", node_id=allocs[0]["NodeID"])
    s.call("GET", "/v1/evaluations")
    s.call("GET", "/v1/evaluation/{eval_id}", eval_id=reg["EvalID"])
    s.call("GET", "/v1/evaluation/{eval_id}/allocations", eval_id=reg["EvalID"])
    s.call("GET", "/v1/evaluation/{eval_id}", eval_id="00000000-0000-0000-0000-000000000000")
    s.call("GET", "/v1/metrics")
    s.call("GET", "/v1/metrics", params=[("format", "prometheus")])

    # v1 through PUT /v1/job/:id: a deployment that stays running (60 s to healthy), paused, resumed, failed.
    s.call("PUT", "/v1/job/{job_id}", job_id="conf", body=conf_job(["301"], 60))
    other = conf_job(["301"], 60)
    other["Job"] |= {"ID": "other", "Name": "other"}
    s.call("PUT", "/v1/job/{job_id}", job_id="conf", body=other)  # ID mismatch: 400
    dep = s.call("GET", "/v1/job/{job_id}/deployment", job_id="conf",
                 until=lambda r: _status(r, "running") and r.json()["JobVersion"] == 1).json()
    s.call("POST", "/v1/job/{job_id}/scale", job_id="conf", body={"Count": 3, "Target": {"Group": "cache"}})
    did = dep["ID"]
    s.call("POST", "/v1/deployment/pause/{deployment_id}", deployment_id=did, body={"Pause": True})  # no ID: 400
    s.call("POST", "/v1/deployment/pause/{deployment_id}", deployment_id=did,
           body={"Pause": True, "DeploymentID": "00000000-0000-0000-0000-000000000000"})  # 400
    s.call("POST", "/v1/deployment/pause/{deployment_id}", deployment_id=did, body={"Pause": True, "DeploymentID": did})
    s.call("GET", "/v1/deployment/{deployment_id}", deployment_id=did, until=lambda r: _status(r, "paused"))
    s.call("PUT", "/v1/deployment/pause/{deployment_id}", deployment_id=did, body={"Pause": False, "DeploymentID": did})
    s.call("POST", "/v1/deployment/fail/{deployment_id}", deployment_id=did)
    s.call("GET", "/v1/job/{job_id}/deployment", job_id="conf", until=lambda r: _status(r, "failed"))
    s.call("PUT", "/v1/deployment/fail/{deployment_id}", deployment_id=did)  # terminal already: 500
    s.call("POST", "/v1/deployment/pause/{deployment_id}", deployment_id=did, body={"Pause": True, "DeploymentID": did})
    s.call("POST", "/v1/deployment/fail/{deployment_id}", deployment_id="00000000-0000-0000-0000-000000000000")

    # Scale once no deployment is active (v2), then v3 through POST /v1/job/:id and a no-op PUT /v1/jobs.
    s.call("PUT", "/v1/job/{job_id}/scale", job_id="conf", body={"Count": 3, "Target": {"Group": "cache"},
                                                                "Message": "conformance"})
    s.call("GET", "/v1/job/{job_id}/scale", job_id="conf")
    s.call("GET", "/v1/job/{job_id}/deployment", job_id="conf",
           until=lambda r: _status(r, "running", "successful", "failed") and r.json()["JobVersion"] == 2)
    s.call("POST", "/v1/job/{job_id}", job_id="conf", body=conf_job(["302"], 1, count=2))
    s.call("GET", "/v1/job/{job_id}/deployment", job_id="conf",
           until=lambda r: _status(r, "successful") and r.json()["JobVersion"] == 3)
    s.call("PUT", "/v1/jobs", body=conf_job(["302"], 1, count=2))
    # Not recorded: whether the agent has a health for the replaced allocations by now is a race.
    allocs = s.call("GET", "/v1/job/{job_id}/allocations", job_id="conf", record=False,
                    until=lambda r: sorted(a["ClientStatus"] for a in r.json()
                                           if a["DesiredStatus"] == "run") == ["running", "running"]).json()
    running = [a for a in allocs if a["ClientStatus"] == "running"]

    # Allocations stopped (each is replaced).
    s.call("POST", "/v1/allocation/{alloc_id}/stop", alloc_id=running[0]["ID"])
    s.call("PUT", "/v1/allocation/{alloc_id}/stop", alloc_id=running[1]["ID"])
    s.call("POST", "/v1/allocation/{alloc_id}/stop", alloc_id="00000000-0000-0000-0000-000000000000")

    # Node eligibility and drain, on cache3.
    nid = by_name["cache3"]
    s.call("POST", "/v1/node/{node_id}/eligibility", node_id=nid, body={"Eligibility": "ineligible"})
    s.call("PUT", "/v1/node/{node_id}/eligibility", node_id=nid, body={"Eligibility": "eligible"})
    s.call("POST", "/v1/node/{node_id}/eligibility", node_id=nid, body={"Eligibility": "maybe"})
    s.call("POST", "/v1/node/{node_id}/drain", node_id=nid,
           body={"DrainSpec": {"Deadline": 60 * S, "IgnoreSystemJobs": False}, "Meta": {"why": "conformance"}})
    s.call("GET", "/v1/node/{node_id}", node_id=nid)
    s.call("PUT", "/v1/node/{node_id}/drain", node_id=nid, body={"DrainSpec": None, "MarkEligible": True})
    s.call("GET", "/v1/nodes", until=lambda r: all(n["SchedulingEligibility"] == "eligible" for n in r.json()))

    # Stop, then purge.
    s.call("DELETE", "/v1/job/{job_id}", job_id="conf")
    s.call("GET", "/v1/job/{job_id}", job_id="conf", until=lambda r: r.json()["Stop"])
    s.call("GET", "/v1/job/{job_id}/summary", job_id="conf")
    s.call("DELETE", "/v1/job/{job_id}", job_id="conf", params=[("purge", "true")])
    s.call("GET", "/v1/job/{job_id}", job_id="conf", until=lambda r: r.status_code == 404)
    s.call("GET", "/v1/jobs")


# ---- recording -----------------------------------------------------------------------------------------
def write(name: str, agent: str, exchanges: list[dict[str, Any]]) -> Path:
    RECORDINGS.mkdir(exist_ok=True)
    path = RECORDINGS / f"{name}.json"
    doc = {"format": FORMAT, "agent": agent, "recorded_with": "python -m tests.standins.record_conformance",
           "exchanges": exchanges}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def _version(url: str, token: str | None, pick: Callable[[dict[str, Any]], str]) -> str:
    headers = {"X-Consul-Token": token} if token else {}
    return pick(httpx.get(f"{url}/v1/agent/self", headers=headers, timeout=10).json())


def main() -> int:
    from lab.hashistack.local import LocalStack, missing_binaries

    if missing := missing_binaries():
        print(f"no {', '.join(missing)} binary on PATH: put the real ones first "
              "(PATH=.cache/hashistack:$PATH)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        with LocalStack(Path(tmp) / "stack", consul_token=CONSUL_TOKEN, consul_servers=3,
                        nomad_clients=3) as stack:
            consul = Session(stack.consul_urls, token=CONSUL_TOKEN)
            consul_scenario(consul, node=stack.consuls[0].node_name)
            nomad = Session([stack.nomad_url])
            nomad_scenario(nomad)
            cv = _version(stack.consul_url, CONSUL_TOKEN, lambda d: f"consul {d['Config']['Version']}")
            nv = _version(stack.nomad_url, None, lambda d: f"nomad {d['config']['Version']['Version']}")
            consul.client.close()
            nomad.client.close()
        for name, agent, sess in (("consul", cv, consul), ("nomad", nv, nomad)):
            path = write(name, agent, sess.exchanges)
            routes = {(e["method"], e["route"]) for e in sess.exchanges}
            print(f"{path}: {agent}, {len(sess.exchanges)} exchanges over {len(routes)} routes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
