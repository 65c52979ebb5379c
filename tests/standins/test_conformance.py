"""Stand-in conformance: the stand-ins answer as the real agents did, and serve nothing the agents were not seen to.

tests/standins/recordings/{consul,nomad}.json hold what real Consul and Nomad answered to the scenarios in
record_conformance.py (status, protocol headers, the shape of each answer). These tests need no real binary:
they replay the same scenarios against the stand-ins and compare, and they fail when a stand-in registers a
route the recordings do not cover, so the stand-ins stay a fallback and do not grow on their own.

A difference is fixed in the stand-in (the real agent is the reference) or listed below with a reason;
an allow-list entry that no longer matches anything fails too, so the lists only shrink.

Re-record, with the real binaries first on PATH, when a stand-in gains a route (extend the scenario in
record_conformance.py first) or the lab moves to a new Consul or Nomad release:

    PATH=.cache/hashistack:$PATH .venv/bin/python -m tests.standins.record_conformance
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import pytest

from lab.standins.clock import FakeClock, RealClock
from lab.standins.consul import build_cluster
from lab.standins.consul import make_app as consul_app
from lab.standins.nomad import make_app as nomad_app
from lab.standins.nomad import parse_node
from lab.standins.nomad_state import NomadState

from .conftest import start_consul, start_nomad
from .record_conformance import (
    CONSUL_TOKEN,
    RECORDINGS,
    Session,
    _kind,
    _members,
    consul_scenario,
    nomad_scenario,
)


@dataclass(frozen=True)
class Allow:
    """A known difference: `on` matches "METHOD /route/{pattern}" or "METHOD /concrete/path" (fnmatch),
    `kind` the difference's kind, `where` its place in the answer ("$.Config.Version", fnmatch)."""

    on: str
    kind: str
    where: str
    reason: str


# ---- known differences ---------------------------------------------------------------------------------
CONSUL_ALLOWED = [
    Allow("GET /v1/agent/self", "missing", "$.DebugConfig.*",
          "abridged: the agent's whole runtime config (~200 fields); the stand-in keeps the few that are read"),
    Allow("GET /v1/agent/self", "missing", "$.Stats.runtime",
          "Go runtime counters (goroutines, GOMAXPROCS...): a stand-in has none to report"),
    Allow("GET /v1/agent/self", "missing", "$.Stats.serf_lan",
          "serf gossip counters: the stand-in runs no gossip"),
    Allow("GET /v1/agent/metrics", "empty", "$.Counters",
          "the stand-in serves only the gauges and summaries the alert rules read, no counters"),
    Allow("GET /v1/catalog/nodes?dc=dc-nowhere", "header", "X-Consul-*",
          "the stand-in refuses an unknown datacenter in its middleware, before any query metadata is set"),
]

_JOB = "the stand-in keeps a job as submitted plus what it models; the agent's canonical fields for features " \
       "the lab never uses (spreads, periodic, volumes, multiregion, UI, vault, consul...) are absent"
_ALLOC = "abridged allocation: no resources, network status, placement metrics or signing key (not modelled)"
_NODE = "abridged node: no CSI plugins, host volumes or networks, NUMA/device resources (not modelled)"
_NODE_EVALS = "on eligibility the stand-in evaluates system jobs only; the agent also each job with " \
              "allocations on the node"
NOMAD_ALLOWED = [
    Allow("GET /v1/agent/self", "missing", "$.*",
          "abridged: the agent's runtime config, member and stats; the stand-in keeps version, region, roles"),
    Allow("GET /v1/job/{job_id}", "missing", "$.*", _JOB),
    Allow("GET /v1/job/{job_id}/versions", "missing", "$.Versions[].*", _JOB),
    Allow("GET /v1/allocation/{alloc_id}", "missing", "$.Job.*", _JOB),
    Allow("GET /v1/node/{node_id}/allocations", "missing", "$[].Job.*", _JOB),
    Allow("GET /v1/allocation/{alloc_id}", "missing", "$.*", _ALLOC),
    Allow("GET /v1/node/{node_id}/allocations", "missing", "$[].*", _ALLOC),
    Allow("GET /v1/node/{node_id}", "missing", "$.*", _NODE),
    Allow("GET /v1/nodes", "missing", "$[].HostVolumes", _NODE),
    Allow("GET /v1/node/{node_id}", "type", "$.DrainStrategy",
          "the stand-in migrates at once, so a drain completes (DrainStrategy cleared) before the next read"),
    Allow("GET /v1/*evaluation*", "missing", "$*.PlanAnnotations",
          "the scheduler's plan annotations (desired changes per group) are not modelled"),
    Allow("PUT /v1/node/{node_id}/*", "type", "$.EvalIDs", _NODE_EVALS),
    Allow("GET /v1/job/{job_id}/scale", "type", "$.TaskGroups.*.Events",
          "scaling events (the messages of POST /v1/job/:id/scale) are not kept: Events stays null"),
    Allow("GET /v1/metrics", "empty", "$.Counters", "the stand-in serves only the gauges the alert rules read"),
    Allow("GET /v1/metrics", "empty", "$.Samples", "the stand-in serves only the gauges the alert rules read"),
]

# Stand-in routes no recording covers, each with why it may exist.
ROUTES_NOT_RECORDED = {
    ("consul", "GET", "/_lab/faults"): "lab-only fault hook (injected contention, slow leader); no agent has it",
    ("consul", "POST", "/_lab/faults"): "lab-only fault hook (injected contention, slow leader); no agent has it",
    ("consul", "DELETE", "/_lab/faults"): "lab-only fault hook (injected contention, slow leader); no agent has it",
    ("nomad", "GET", "/_lab/faults"): "lab-only fault hook (an unhealthy node kept eligible); no agent has it",
    ("nomad", "POST", "/_lab/faults"): "lab-only fault hook (an unhealthy node kept eligible); no agent has it",
    ("nomad", "DELETE", "/_lab/faults"): "lab-only fault hook (an unhealthy node kept eligible); no agent has it",
}


# ---- comparing shapes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Diff:
    step: int
    method: str
    route: str
    path: str
    kind: str  # status | header | missing | extra | type | empty | items
    where: str
    detail: str

    def __str__(self) -> str:
        return f"#{self.step} {self.method} {self.path}: {self.kind} at {self.where}: {self.detail}"


def _show(s: Any) -> str:
    text = json.dumps(s)
    return text if len(text) <= 90 else text[:87] + "..."


def shape_diffs(rec: Any, got: Any, where: str = "$") -> list[tuple[str, str, str]]:
    """(kind, where, detail) for each way `got` (the stand-in's shape) departs from `rec` (the agent's).

    A value whose kind varied in the recording ($anyOf) may come back as any of those kinds; an object must
    have the same keys; a list the same item shape; an empty list or map matches by kind only when the
    other side is empty too (an "empty"/"items" difference otherwise)."""
    if rec == got:
        return []
    rec_by = {_kind(m): m for m in _members(rec)}
    got_by = {_kind(m): m for m in _members(got)}
    out: list[tuple[str, str, str]] = []
    strange = [k for k in got_by if k not in rec_by]
    if strange:
        return [("type", where, f"agent {_show(rec)}, stand-in {_show(got)}")]
    for k, g in got_by.items():
        r = rec_by[k]
        if k == "object":
            for key in sorted(r.keys() - g.keys()):
                out.append(("missing", f"{where}.{key}", f"agent has {_show(r[key])}"))
            for key in sorted(g.keys() - r.keys()):
                out.append(("extra", f"{where}.{key}", f"stand-in has {_show(g[key])}"))
            for key in sorted(r.keys() & g.keys()):
                out += shape_diffs(r[key], g[key], f"{where}.{key}")
        elif k == "list":
            if r and g:
                out += shape_diffs(r[0], g[0], f"{where}[]")
            elif r:
                out.append(("empty", where, f"agent's items {_show(r[0])}, stand-in's list empty"))
            elif g:
                out.append(("items", where, f"agent's list empty, stand-in's items {_show(g[0])}"))
        elif k == "map" and "empty" not in (r["$map"], g["$map"]):
            out += shape_diffs(r["$map"], g["$map"], f"{where}.*")
    return out


def compare(recorded: list[dict[str, Any]], replayed: list[dict[str, Any]]) -> list[Diff]:
    for i, (rec, got) in enumerate(zip(recorded, replayed, strict=False)):
        rq = (rec["method"], rec["route"], rec["request"])
        gq = (got["method"], got["route"], got["request"])
        if rq != gq:
            pytest.fail(f"exchange #{i}: the scenario sends {gq} where the recording has {rq}: "
                        "the scenario changed; re-record (see this module's docstring)")
    if len(recorded) != len(replayed):
        pytest.fail(f"the recording has {len(recorded)} exchanges, the scenario played {len(replayed)}: re-record")
    diffs = []
    for i, (rec, got) in enumerate(zip(recorded, replayed, strict=True)):
        def add(kind: str, where: str, detail: str, i=i, rec=rec) -> None:
            diffs.append(Diff(i, rec["method"], rec["route"], rec["request"]["path"], kind, where, detail))

        if rec["status"] != got["status"]:
            texts = f" ({rec.get('text', '')!r} / {got.get('text', '')!r})" if "text" in rec or "text" in got else ""
            add("status", "status", f"agent {rec['status']}, stand-in {got['status']}{texts}")
            continue
        for header in sorted(set(rec["headers"]) ^ set(got["headers"])):
            add("header", header, "agent sends it, stand-in does not" if header in rec["headers"]
                else "stand-in sends it, agent does not")
        for kind, where, detail in shape_diffs(rec["answer"], got["answer"]):
            add(kind, where, detail)
    return diffs


def judge(diffs: list[Diff], allowed: list[Allow], recorded: list[dict[str, Any]]) -> None:
    used: set[Allow] = set()
    unexplained = []
    for d in diffs:
        query = recorded[d.step]["request"].get("query")
        lines = {f"{d.method} {d.route}", f"{d.method} {d.path}"}
        if query:
            lines.add(f"{d.method} {d.path}?" + "&".join(f"{k}={v}" if v else k for k, v in query))
        hit = next((a for a in allowed if a.kind == d.kind and fnmatchcase(d.where, a.where)
                    and any(fnmatchcase(line, a.on) for line in lines)), None)
        if hit is None:
            unexplained.append(d)
        else:
            used.add(hit)
    stale = [a for a in allowed if a not in used]
    report = []
    if unexplained:
        report.append(f"{len(unexplained)} difference(s) from the real agent (fix the stand-in, or allow-list "
                      "with a reason in test_conformance.py):")
        report += [f"  {d}" for d in unexplained]
    if stale:
        report.append("allow-list entries that match no difference any more (delete them):")
        report += [f"  {a}" for a in stale]
    if report:
        pytest.fail("\n".join(report), pytrace=False)


def recording(name: str) -> list[dict[str, Any]]:
    return json.loads((RECORDINGS / f"{name}.json").read_text())["exchanges"]


# ---- replay ------------------------------------------------------------------------------------------------
def test_consul_standin_answers_as_recorded():
    lab = start_consul(FakeClock(), acl_token=CONSUL_TOKEN)
    session = Session([f"http://127.0.0.1:{p}" for p in lab.ports.values()], token=CONSUL_TOKEN)
    try:
        consul_scenario(session, node=next(iter(lab.ports)))
    finally:
        session.client.close()
        lab.server.stop()
    recorded = recording("consul")
    judge(compare(recorded, session.exchanges), CONSUL_ALLOWED, recorded)


def test_nomad_standin_answers_as_recorded(tmp_path):
    # Deployments progress in real time, as on the agent (the scenario waits for them, not a fake clock).
    lab = start_nomad(RealClock(), tmp_path / "nomad")
    session = Session([lab.url])
    try:
        nomad_scenario(session)
    finally:
        session.client.close()
        lab.server.stop()
    recorded = recording("nomad")
    judge(compare(recorded, session.exchanges), NOMAD_ALLOWED, recorded)


# ---- the route guard -------------------------------------------------------------------------------------
def standin_routes() -> set[tuple[str, str, str]]:
    """(stand-in, method, canonical path) of every route the stand-ins' aiohttp apps register. HEAD is left
    out: aiohttp adds it to every GET route (add_get's allow_head), and nothing sends it."""
    cluster = build_cluster([("consul1", "127.0.0.1")], clock=FakeClock())
    state = NomadState([parse_node("cache1")], clock=FakeClock())
    apps = {"consul": consul_app(cluster, "consul1"), "nomad": nomad_app(state, run_housekeeping=False)}
    return {(name, route.method, route.resource.canonical)
            for name, app in apps.items() for route in app.router.routes()
            if route.method != "HEAD" and route.resource is not None}


def test_every_standin_route_is_covered_by_the_recordings():
    covered = {(name, e["method"], e["route"]) for name in ("consul", "nomad") for e in recording(name)}
    routes = standin_routes()
    assert routes, "no routes found: the stand-ins' apps changed shape"
    uncovered = sorted(r for r in routes - covered if r not in ROUTES_NOT_RECORDED)
    assert not uncovered, (
        "stand-in routes the conformance recordings do not cover (the stand-ins are a fallback and do not grow "
        "unseen): add them to the scenario in tests/standins/record_conformance.py and re-record with the real "
        "agents, or allow-list a lab-only hook in ROUTES_NOT_RECORDED with a reason:\n"
        + "\n".join(f"  {n} {m} {p}" for n, m, p in uncovered))
    stale = sorted(r for r in ROUTES_NOT_RECORDED if r not in routes or r in covered)
    assert not stale, f"ROUTES_NOT_RECORDED entries the stand-ins no longer serve, or that are recorded: {stale}"


def test_the_shape_comparison_sees_differences():
    """The comparison itself: a missing key, an extra key, a changed kind, an emptied list."""
    rec = {"A": "string", "B": ["number"], "C": {"$anyOf": ["null", "string"]}, "D": {"E": "bool"}}
    got = {"A": "number", "B": [], "C": "null", "D": {"F": "bool"}, "G": "string"}
    assert sorted((k, w) for k, w, _ in shape_diffs(rec, got)) == [
        ("empty", "$.B"), ("extra", "$.D.F"), ("extra", "$.G"), ("missing", "$.D.E"), ("type", "$.A")]
    assert shape_diffs(rec, rec) == []
    assert shape_diffs({"$map": "string"}, {"$map": "empty"}) == []
