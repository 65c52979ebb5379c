"""Consul health and leadership actions: every server's view, gates' figures, and moving the raft leader."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import consul
from prometheus_client.parser import text_string_to_metric_families
from temporalio.exceptions import ApplicationError

from activities._clients import ConsulTarget, bad, call, consul_client, consul_get, consul_token, heartbeat, unavailable
from activities.binding import implements
from activities.contracts.consul_leadership import (
    HEALTH,
    LEADER_TRANSFER,
    HealthInput,
    HealthOutput,
    LeaderTransferInput,
    LeaderTransferOutput,
    ServerReport,
)

__all__ = ["health", "leader_transfer"]


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


@implements(HEALTH)
def health(inp: HealthInput) -> HealthOutput:
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


def _raft_servers(client: consul.Consul) -> list[dict[str, Any]]:
    return call("read raft configuration",
                lambda: consul_get(client, "/v1/operator/raft/configuration")).get("Servers") or []


@implements(LEADER_TRANSFER)
def leader_transfer(inp: LeaderTransferInput) -> LeaderTransferOutput:
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
    healthy = {s.get("ID") for s in autopilot.get("Servers", []) if s.get("Healthy")}
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
