"""Consul stand-in exercised only through py-consul (plus the documented HTTP shapes)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import threading
import time

import consul
import msgpack
import pytest
import requests
from consul.exceptions import ACLPermissionDenied, ConsulException

from lab.standins.clock import FakeClock

from .conftest import start_consul


def test_status_and_raft_views_agree(consul_lab):
    c = consul_lab.client("consul2")
    leader = c.status.leader()
    peers = c.status.peers()
    assert leader in peers and len(peers) == 3
    cfg = c.operator.raft_config()
    assert {s["Node"] for s in cfg["Servers"]} == {"consul1", "consul2", "consul3"}
    assert [s["Address"] for s in cfg["Servers"] if s["Leader"]] == [leader]
    assert all(s["Voter"] for s in cfg["Servers"])


def test_agent_self_answers_as_the_listener_server(consul_lab):
    for name in ("consul1", "consul2", "consul3"):
        me = consul_lab.client(name).agent.self()
        assert me["Config"]["NodeName"] == name
        assert me["Config"]["Server"] is True
        assert me["Stats"]["consul"]["leader"] == ("true" if name == "consul1" else "false")
        assert me["Stats"]["raft"]["state"] == ("Leader" if name == "consul1" else "Follower")
    assert {m["Name"] for m in consul_lab.client().agent.members()} == {"consul1", "consul2", "consul3"}


def test_kv_crud_recurse_keys_and_index(consul_lab):
    c = consul_lab.client()
    assert c.kv.put("app/a", "1") is True
    assert c.kv.put("app/b", b"2", flags=42) is True
    assert c.kv.put("app/sub/c", "3") is True
    index, entry = c.kv.get("app/b")
    assert entry["Value"] == b"2" and entry["Flags"] == 42 and int(index) >= entry["ModifyIndex"]
    _, entries = c.kv.get("app/", recurse=True)
    assert [e["Key"] for e in entries] == ["app/a", "app/b", "app/sub/c"]
    _, keys = c.kv.get("app/", keys=True, separator="/")
    assert keys == ["app/a", "app/b", "app/sub/"]
    index, missing = c.kv.get("nope")
    assert missing is None and int(index) > 0  # 404 still carries X-Consul-Index
    assert c.kv.delete("app/a") is True
    assert c.kv.get("app/a")[1] is None
    assert c.kv.delete("app/", recurse=True) is True
    assert c.kv.get("app/", recurse=True)[1] is None
    raw = requests.get(f"http://127.0.0.1:{consul_lab.ports['consul1']}/v1/kv/app", params={"raw": ""})
    assert raw.status_code == 404


def test_kv_cas_conflicts(consul_lab):
    c = consul_lab.client()
    assert c.kv.put("cfg", "v1", cas=0) is True
    assert c.kv.put("cfg", "v2", cas=0) is False  # cas=0 only creates
    _, entry = c.kv.get("cfg")
    assert c.kv.put("cfg", "v2", cas=entry["ModifyIndex"] + 100) is False
    assert c.kv.put("cfg", "v2", cas=entry["ModifyIndex"]) is True
    assert c.kv.put("cfg", "v3", cas=entry["ModifyIndex"]) is False  # stale index
    _, entry2 = c.kv.get("cfg")
    assert entry2["Value"] == b"v2"
    assert c.kv.delete("cfg", cas=0) is False
    assert c.kv.delete("cfg", cas=entry["ModifyIndex"]) is False
    assert c.kv.delete("cfg", cas=entry2["ModifyIndex"]) is True


def test_txn_is_all_or_nothing_with_consuls_own_errors(consul_lab):
    """The answers below were read from a real Consul 1.22.7 dev agent."""
    url = f"http://127.0.0.1:{consul_lab.ports['consul1']}/v1/txn"
    c = consul_lab.client()
    c.kv.put("s/a", "x")
    c.kv.put("s/b", "y")
    _, a = c.kv.get("s/a")

    def txn(*ops):
        return requests.put(url, data=json.dumps([{"KV": op} for op in ops]))

    stale = txn({"Verb": "delete-cas", "Key": "s/b", "Index": a["ModifyIndex"] + 100},
                {"Verb": "delete-cas", "Key": "s/a", "Index": a["ModifyIndex"]})
    assert stale.status_code == 409
    assert stale.json() == {"Results": None, "Errors": [
        {"OpIndex": 0, "What": 'failed to delete key "s/b", index is stale'}]}
    assert c.kv.get("s/a")[1] is not None  # the good op was rolled back with the bad one
    gone = txn({"Verb": "delete-cas", "Key": "s/zz", "Index": 0})
    assert (gone.status_code, gone.json()) == (200, {"Results": [], "Errors": None})
    mixed = txn({"Verb": "set", "Key": "s/c", "Value": "eg=="}, {"Verb": "get", "Key": "s/b"},
                {"Verb": "delete", "Key": "s/b"})
    assert mixed.status_code == 200
    results = [r["KV"] for r in mixed.json()["Results"]]
    assert [(r["Key"], r["Value"]) for r in results] == [("s/c", None), ("s/b", "eQ==")]
    assert c.kv.get("s/b")[1] is None and c.kv.get("s/c")[1]["Value"] == b"z"
    both = txn({"Verb": "check-index", "Key": "s/c", "Index": 1}, {"Verb": "delete-cas", "Key": "s/c", "Index": 1})
    index = results[0]["ModifyIndex"]
    assert both.json()["Errors"] == [
        {"OpIndex": 0, "What": f'failed index check for key "s/c", current modify index {index} != 1'},
        {"OpIndex": 1, "What": 'failed to delete key "s/c", index is stale'}]
    read = txn({"Verb": "check-not-exists", "Key": "s/c"})
    assert read.status_code == 409 and read.json()["Errors"] == [{"OpIndex": 0, "What": 'key "s/c" exists'}]
    assert read.json()["KnownLeader"] is True  # read-only transactions answer through the read path
    assert txn({"Verb": "bogus", "Key": "s/c"}).json()["Errors"] == [
        {"OpIndex": 0, "What": "unknown KV operation: bogus"}]
    assert requests.put(url, data="notjson").status_code == 400


def test_blocking_query_returns_on_change(consul_lab):
    c = consul_lab.client("consul2")
    c.kv.put("watch/me", "before")
    index, _ = c.kv.get("watch/me")
    result = {}

    def watcher():
        t0 = time.monotonic()
        result["got"] = c.kv.get("watch/me", index=index, wait="20s")
        result["elapsed"] = time.monotonic() - t0

    th = threading.Thread(target=watcher)
    th.start()
    time.sleep(0.3)
    assert th.is_alive(), "blocking query must hold while nothing changes"
    consul_lab.client("consul3").kv.put("watch/me", "after")
    th.join(10)
    new_index, entry = result["got"]
    assert entry["Value"] == b"after" and int(new_index) > int(index)
    assert result["elapsed"] < 5


def test_blocking_query_times_out_with_same_index(consul_lab):
    c = consul_lab.client()
    c.kv.put("idle", "x")
    index, _ = c.kv.get("idle")
    t0 = time.monotonic()
    new_index, _ = c.kv.get("idle", index=index, wait="500ms")
    assert new_index == index
    assert 0.45 <= time.monotonic() - t0 < 3


def test_snapshot_save_modify_restore_round_trip(consul_lab, tmp_path):
    c = consul_lab.client()
    c.kv.put("keep/one", "original")
    c.kv.put("keep/two", "2")
    saved_index = c.kv.get("", recurse=True)[0]
    archive = c.snapshot.save()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive))) as tar:
        assert tar.getnames() == ["meta.json", "state.bin", "SHA256SUMS"]  # what real Consul writes
        meta = json.loads(tar.extractfile("meta.json").read())
        state = tar.extractfile("state.bin").read()
    assert meta["Size"] == len(state) and meta["ID"].startswith(f"{meta['Term']}-{meta['Index']}-")
    assert [s["Suffrage"] for s in meta["Configuration"]["Servers"]] == [0, 0, 0]
    records = msgpack.Unpacker(io.BytesIO(state), raw=True)
    assert records.unpack() == {b"LastIndex": meta["Index"]}
    assert records.read_bytes(1) == b"\x02" and records.unpack()[b"Key"] == b"keep/one"  # a KVS record
    resp = requests.get(f"http://127.0.0.1:{consul_lab.ports['consul1']}/v1/snapshot", timeout=10)
    assert int(resp.headers["X-Consul-Index"]) > 0
    (tmp_path / "backup.snap").write_bytes(archive)
    c.kv.put("keep/one", "changed")
    c.kv.delete("keep/two")
    c.kv.put("extra", "new")
    assert c.snapshot.restore((tmp_path / "backup.snap").read_bytes()) is True
    assert c.kv.get("keep/one")[1]["Value"] == b"original"
    assert c.kv.get("keep/two")[1]["Value"] == b"2"
    assert c.kv.get("extra")[1] is None
    assert c.kv.get("", recurse=True)[0] == saved_index  # KV reads report the snapshot's index again, as Consul does
    with pytest.raises(ConsulException, match="gzip: invalid header"):
        c.snapshot.restore(b"not an archive")


def test_snapshot_restore_refuses_what_consul_refuses(consul_lab):
    c = consul_lab.client()
    c.kv.put("stay", "here")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(c.snapshot.save()))) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    padded = io.BytesIO()
    with tarfile.open(fileobj=padded, mode="w") as tar:  # Python's tarfile pads to 10 KiB records; Go's reader minds
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ConsulException, match="unread uncompressed bytes remain"):
        c.snapshot.restore(gzip.compress(padded.getvalue()))
    with pytest.raises(ConsulException, match="unexpected EOF"):
        c.snapshot.restore(c.snapshot.save()[:300])
    assert c.kv.get("stay")[1]["Value"] == b"here"


def test_services_checks_catalog_and_health(consul_lab):
    c = consul_lab.client("consul2")
    assert c.agent.service.register("cache", service_id="cache-1", address="10.0.0.5", port=6379,
                                    tags=["primary"], check=consul.Check.ttl("10s"))
    assert c.agent.check.register("cache-alive", check=consul.Check.ttl("30s"), check_id="cache-alive",
                                  service_id="cache-1")
    assert "cache-1" in c.agent.services()
    assert c.agent.checks()["service:cache-1"]["Status"] == "critical"  # TTL checks start critical
    _, services = c.catalog.services()
    assert services["cache"] == ["primary"] and "consul" in services
    _, nodes = c.catalog.service("cache")
    assert nodes[0]["Node"] == "consul2" and nodes[0]["ServicePort"] == 6379
    assert len(c.health.service("cache")[1]) == 1
    assert c.health.service("cache", passing=True)[1] == []
    c.agent.check.ttl_pass("service:cache-1")
    c.agent.check.ttl_pass("cache-alive", notes="ok")
    _, healthy = c.health.service("cache", passing=True)
    assert [e["Service"]["ID"] for e in healthy] == ["cache-1"]
    assert {ch["CheckID"] for ch in healthy[0]["Checks"]} == {"serfHealth", "service:cache-1", "cache-alive"}
    c.agent.check.ttl_fail("cache-alive", notes="down")
    assert c.health.service("cache", passing=True)[1] == []
    c.agent.check.ttl_pass("cache-alive")
    # TTL expiry is driven by the injected clock, not by sleeping.
    consul_lab.clock.advance(15)
    assert c.health.service("cache", passing=True)[1] == []
    assert c.agent.checks()["service:cache-1"]["Output"] == "TTL expired"
    resp = requests.put(f"http://127.0.0.1:{consul_lab.ports['consul2']}/v1/agent/check/update/service:cache-1",
                        json={"Status": "passing", "Output": "fine"}, timeout=10)
    assert resp.status_code == 200
    assert c.agent.checks()["service:cache-1"]["Status"] == "passing"
    assert c.agent.check.deregister("cache-alive")
    assert c.agent.service.deregister("cache-1")
    assert c.health.service("cache")[1] == []
    assert c.agent.check.ttl_pass("no-such-check") is False  # 404: unknown check ID


def test_autopilot_and_transfer_leader_by_id(consul_lab):
    c = consul_lab.client()
    health = c.operator.autopilot_health()
    assert health["Healthy"] is True and health["FailureTolerance"] == 1
    assert [s["Name"] for s in health["Servers"] if s["Leader"]] == ["consul1"]
    target = next(s for s in c.operator.raft_config()["Servers"] if s["Node"] == "consul3")
    assert c.operator.raft_transfer_leader(target["ID"]) is True
    assert c.status.leader() == target["Address"]
    assert consul_lab.client("consul3").agent.self()["Stats"]["consul"]["leader"] == "true"
    with pytest.raises(ConsulException):
        c.operator.raft_transfer_leader("00000000-0000-0000-0000-000000000000")


def test_metrics_export_contract_names(consul_lab):
    from prometheus_client.parser import text_string_to_metric_families

    c = consul_lab.client()
    c.kv.put("m", "1")
    consul_lab.clock.advance(2)
    text = c.agent.metrics(format_prometheus=True)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("consul_kvs_apply", "consul_raft_leader_lastContact", "consul_raft_commitTime",
                 "consul_raft_boltdb_freelistBytes", "consul_autopilot_healthy", "consul_server_isLeader",
                 "consul_autopilot_failure_tolerance"):
        assert name in fams, name
    assert fams["consul_kvs_apply"].type == "summary"
    assert {s.labels.get("quantile") for s in fams["consul_kvs_apply"].samples} >= {"0.5", "0.9", "0.99"}
    assert fams["consul_server_isLeader"].samples[0].value == 1
    follower = consul_lab.client("consul2").agent.metrics(format_prometheus=True)
    assert "\nconsul_server_isLeader 0\n" in follower  # Go spells whole numbers without ".0"
    as_json = c.agent.metrics()
    assert any(g["Name"] == "consul.server.isLeader" for g in as_json["Gauges"])


def test_acl_token_required_when_configured(consul_acl_lab):
    anon = consul_acl_lab.client()
    assert anon.status.leader()  # status endpoints need no ACL, as in Consul
    with pytest.raises(ACLPermissionDenied):
        anon.kv.put("x", "1")
    with pytest.raises(ACLPermissionDenied):
        consul_acl_lab.client(token="wrong").kv.get("x")
    resp = requests.get(f"http://127.0.0.1:{consul_acl_lab.ports['consul1']}/v1/kv/x", timeout=10)
    assert resp.status_code == 403 and resp.text == "Permission denied"
    with pytest.raises(ACLPermissionDenied):
        consul_acl_lab.client(token="s3cret").agent.self()  # py-consul sends no token here, like real Consul denies
    good = consul_acl_lab.client(token="s3cret")
    assert good.kv.put("x", "1") is True
    assert good.kv.get("x")[1]["Value"] == b"1"
    assert good.agent.metrics(format_prometheus=True)


def test_state_dir_survives_restart(tmp_path):
    lab = start_consul(FakeClock(), state_dir=tmp_path)
    try:
        lab.client().kv.put("persist/me", "yes")
        lab.client().snapshot.save()
    finally:
        lab.server.stop()
    assert list((tmp_path / "snapshots").glob("*.snap"))
    lab2 = start_consul(FakeClock(), state_dir=tmp_path)
    try:
        assert lab2.client().kv.get("persist/me")[1]["Value"] == b"yes"
    finally:
        lab2.server.stop()
