"""Load model: KV apply latency and leader contact under contention, slow leaders and leadership transfer."""

from __future__ import annotations

import math
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

from lab.standins.clock import RealClock
from lab.standins.consul_load import LoadParams

from .conftest import SERVERS, start_consul


def summary_p50(lab, server: str, name: str) -> float:
    text = lab.client(server).agent.metrics(format_prometheus=True)
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            for s in fam.samples:
                if s.labels.get("quantile") == "0.5":
                    return s.value
    return math.nan


def gauge(lab, server: str, name: str) -> float:
    text = lab.client(server).agent.metrics(format_prometheus=True)
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            return fam.samples[0].value
    raise KeyError(name)


def cluster_p50(lab, name: str = "consul_kvs_apply") -> float:
    # The recording rule: max over servers, NaN (empty window) ignored like PromQL max.
    vals = [v for v in (summary_p50(lab, s, name) for s in SERVERS) if not math.isnan(v)]
    return max(vals) if vals else math.nan


def writes(lab, n: int, server: str = "consul1") -> None:
    c = lab.client(server)
    for i in range(n):
        c.kv.put(f"load/{i % 10}", "x")


def test_healthy_cluster_reports_postmortem_normals(consul_lab):
    writes(consul_lab, 20)
    consul_lab.clock.advance(3)
    p50 = summary_p50(consul_lab, "consul1", "consul_kvs_apply")
    assert 15 <= p50 <= 45
    assert 15 <= cluster_p50(consul_lab, "consul_raft_leader_lastContact") <= 60
    assert gauge(consul_lab, "consul1", "consul_autopilot_healthy") == 1
    # Each PUT waited out its modelled latency through the clock seam.
    assert all(0.015 <= s <= 0.045 for s in consul_lab.clock.slept)


def test_contention_fault_then_clear_and_lower_load(consul_lab):
    c = consul_lab.client()
    consul_lab.fault(fault="consul-contention", background_rps=400)
    assert c.kv.get("coldstart/flags/streaming")[1]["Value"] == b"true"
    writes(consul_lab, 10)
    consul_lab.clock.advance(2)
    assert cluster_p50(consul_lab) > 300
    assert cluster_p50(consul_lab, "consul_raft_leader_lastContact") > 300
    assert c.operator.autopilot_health()["Healthy"] is False  # 429 with the body
    assert gauge(consul_lab, "consul2", "consul_autopilot_healthy") == 0
    # Lower the load (clients blocked) but keep streaming on: contention eases.
    consul_lab.fault(fault="background-load", rps=0)
    consul_lab.clock.advance(11)  # let the 10 s summary window roll over
    writes(consul_lab, 5)
    assert cluster_p50(consul_lab) < 300
    # Full clear turns the streaming flag off through the same KV key.
    consul_lab.fault(fault="consul-contention")
    consul_lab.clock.advance(1)
    writes(consul_lab, 3)
    assert cluster_p50(consul_lab) > 300
    consul_lab.fault(fault="clear")
    assert c.kv.get("coldstart/flags/streaming")[1]["Value"] == b"false"
    consul_lab.clock.advance(11)
    writes(consul_lab, 5)
    assert cluster_p50(consul_lab) < 300
    assert c.operator.autopilot_health()["Healthy"] is True


def test_streaming_flag_and_client_rate_drive_latency(consul_lab):
    c = consul_lab.client()
    c.kv.put("coldstart/flags/streaming", "true")  # the cluster config flag, set by a client
    consul_lab.clock.advance(2)
    writes(consul_lab, 5)
    low_rate = max(consul_lab.clock.slept[-5:])
    assert low_rate < 0.3  # streaming alone, at low load, is tolerable
    for _ in range(300):  # 300 reads inside the 1 s rate window: heavy client load
        c.kv.get("coldstart/flags/streaming")
    writes(consul_lab, 20)
    assert min(consul_lab.clock.slept[-20:]) > 0.3
    assert cluster_p50(consul_lab) > 300
    consul_lab.clock.advance(11)  # clients blocked: the rate falls away
    writes(consul_lab, 5)
    assert cluster_p50(consul_lab) < 300


def test_slow_leader_then_transfer_leadership(consul_lab):
    c = consul_lab.client("consul2")
    consul_lab.fault(fault="slow-leader", server="consul1")
    writes(consul_lab, 10)
    base_freelist = gauge(consul_lab, "consul1", "consul_raft_boltdb_freelistBytes")
    consul_lab.clock.advance(5)
    assert gauge(consul_lab, "consul1", "consul_raft_boltdb_freelistBytes") > base_freelist
    assert gauge(consul_lab, "consul2", "consul_raft_boltdb_freelistBytes") < base_freelist
    assert cluster_p50(consul_lab) > 300
    assert cluster_p50(consul_lab, "consul_raft_leader_lastContact") > 200
    assert c.operator.autopilot_health()["Healthy"] is False
    old_leader = c.status.leader()
    assert c.operator.raft_transfer_leader() is True  # no id: any other healthy server
    new_leader = c.status.leader()
    assert new_leader != old_leader
    cfg = c.operator.raft_config()
    assert [s["Node"] for s in cfg["Servers"] if s["Leader"]] == ["consul2"]
    assert gauge(consul_lab, "consul2", "consul_server_isLeader") == 1
    assert gauge(consul_lab, "consul1", "consul_server_isLeader") == 0
    consul_lab.clock.advance(11)
    writes(consul_lab, 10, server="consul3")
    assert summary_p50(consul_lab, "consul2", "consul_kvs_apply") < 300
    assert cluster_p50(consul_lab) < 300
    assert cluster_p50(consul_lab, "consul_raft_leader_lastContact") < 200
    assert c.operator.autopilot_health()["Healthy"] is True


def test_real_request_latency_follows_the_model():
    lab = start_consul(RealClock(), LoadParams())
    try:
        c = lab.client()

        def put(key: str) -> float:
            t0 = time.monotonic()
            c.kv.put(key, "1")
            return time.monotonic() - t0
        fast = put("fast")
        requests.post(lab.admin(), json={"fault": "slow-leader", "server": "consul1"}, timeout=10).raise_for_status()
        slow = put("slow")
        c.operator.raft_transfer_leader()
        fast_again = put("fast-again")
        # The model's slow leader sleeps over 0.3 s a write (a floor: a busy machine only adds); the others are
        # compared with it, not with a wall-clock line a loaded machine could cross.
        assert slow > 0.3 and fast < slow / 2 and fast_again < slow / 2, (fast, slow, fast_again)
    finally:
        lab.server.stop()
