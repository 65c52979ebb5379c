"""Consul actions against the 3-server stand-in with ACLs on, the token coming from the Vault stand-in."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities._clients import ConsulTarget, go_duration_seconds
from activities.consul import kv, leadership, snapshots, users
from activities.consul.services import UserService
from activities.contracts.consul_kv import KvEntry
from activities.secrets import forget_cached_secrets

from .conftest import CONSUL_TOKEN


def dump(model) -> str:
    return json.dumps(model.model_dump(mode="json"))


def test_kv_set_is_cas_idempotent_and_undoes(stack):
    target = stack.consul_target()
    admin = stack.admin()
    admin.kv.put("app/mode", "normal", flags=7)
    out = kv.kv_set(kv.KvSetInput(consul=target, key="app/mode", value="degraded"))
    assert out.changed and out.previous_value == "normal" and out.previous.flags == 7
    assert admin.kv.get("app/mode")[1]["Value"] == b"degraded"
    again = kv.kv_set(kv.KvSetInput(consul=target, key="app/mode", value="degraded"))
    assert not again.changed and again.modify_index == out.modify_index
    back = kv.kv_set(out.undo)
    assert back.changed
    entry = admin.kv.get("app/mode")[1]
    assert entry["Value"] == b"normal" and entry["Flags"] == 7
    assert not kv.kv_set(out.undo).changed  # undo retried after success: nothing to do
    created = kv.kv_set(kv.KvSetInput(consul=target, key="app/new", value="x"))
    assert created.previous is None and created.undo.delete
    kv.kv_set(created.undo)
    assert admin.kv.get("app/new")[1] is None
    assert CONSUL_TOKEN not in dump(out) + dump(created)


def test_kv_undo_refuses_to_clobber_a_newer_write(stack):
    target = stack.consul_target()
    out = kv.kv_set(kv.KvSetInput(consul=target, key="app/race", value="ours"))
    stack.admin().kv.put("app/race", "theirs")
    with pytest.raises(ApplicationError) as err:
        kv.kv_set(out.undo)
    assert err.value.non_retryable and "changed since" in str(err.value)
    assert stack.admin().kv.get("app/race")[1]["Value"] == b"theirs"


def test_delete_prefix_records_and_restore_puts_back_exactly(stack):
    target = stack.consul_target()
    admin = stack.admin()
    want = {"cache/scheduling/a": (b"1", 0), "cache/scheduling/b": (b"\x00\xffbin", 3), "cache/scheduling/c/d": (b"x", 0)}
    for k, (v, f) in want.items():
        admin.kv.put(k, v, flags=f)
    admin.kv.put("cache/schedulingX", "keep")
    out = kv.kv_delete_prefix(kv.KvDeletePrefixInput(consul=target, prefix="cache/scheduling/"))
    assert out.count == 3 and sorted(e.key for e in out.deleted) == sorted(want)
    assert admin.kv.get("cache/scheduling/", recurse=True)[1] is None
    assert admin.kv.get("cache/schedulingX")[1]["Value"] == b"keep"
    assert kv.kv_delete_prefix(kv.KvDeletePrefixInput(consul=target, prefix="cache/scheduling/")).count == 0
    restored = kv.kv_restore(out.undo)
    assert sorted(restored.restored) == sorted(want)
    for k, (v, f) in want.items():
        entry = admin.kv.get(k)[1]
        assert (entry["Value"], entry["Flags"]) == (v, f)
    assert kv.kv_restore(out.undo).restored == []  # second undo: nothing to do


def test_delete_prefix_resumes_from_heartbeat_record(stack):
    target = stack.consul_target()
    admin = stack.admin()
    admin.kv.put("sched2/a", "1")
    admin.kv.put("sched2/b", "2")
    # A crashed attempt deleted sched2/a and heartbeated it before dying.
    admin.kv.delete("sched2/a")
    env = ActivityEnvironment()
    import dataclasses

    env.info = dataclasses.replace(env.info, heartbeat_details=[
        {"prefix": "sched2/", "deleted": [{"key": "sched2/a", "value_base64": "MQ==", "flags": 0}]}])
    out = env.run(kv.kv_delete_prefix, kv.KvDeletePrefixInput(consul=target, prefix="sched2/"))
    assert [e.key for e in out.deleted] == ["sched2/a", "sched2/b"]


def test_bad_arguments_are_non_retryable(stack):
    target = stack.consul_target()
    for fn, inp in [
        (kv.kv_set, {"consul": target.model_dump(), "key": "k", "value": "v", "delete": True}),
        (kv.kv_delete_prefix, {"consul": target.model_dump(), "prefix": "/"}),
        (leadership.leader_transfer, {"consul": target.model_dump(), "slow_servers": ["nope"]}),
        (snapshots.snapshot_select, {"store": "/nonexistent", "before": "2021-10-28T00:00:00"}),
        (leadership.health, {"consul": {"address": "not a url"}}),
    ]:
        with pytest.raises(ApplicationError) as err:
            fn(inp)
        assert err.value.non_retryable, (fn, str(err.value))
        assert "\n" not in str(err.value)


def test_secret_never_leaks_and_vault_token_wins_over_env(stack, monkeypatch):
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "wrong-env-token")
    target = stack.consul_target()
    out = kv.kv_set(kv.KvSetInput(consul=target, key="leak/check", value="v"))
    assert CONSUL_TOKEN not in dump(out) and "wrong-env-token" not in dump(out)
    # A wrong secret path and an unreachable agent: the errors name neither token.
    broken = target.model_copy(update={"token": stack.token_ref("coldstart/missing")})
    for inp in (kv.KvSetInput(consul=broken, key="x", value="v"),
                kv.KvSetInput(consul=target.model_copy(update={"address": "http://127.0.0.1:1"}), key="x", value="v")):
        with pytest.raises(ApplicationError) as err:
            kv.kv_set(inp)
        text = str(err.value) + repr(err.value.details)
        assert CONSUL_TOKEN not in text and "root-token" not in text
    no_token = ConsulTarget(address=target.address)
    forget_cached_secrets()  # whatever this test process read before: with a cached token the refusal is retryable
    with pytest.raises(ApplicationError) as err:
        kv.kv_set(kv.KvSetInput(consul=no_token, key="x", value="v"))
    assert err.value.type == "PermissionDenied" and err.value.non_retryable


# --------------------------------------------------------------------------- snapshots


def test_snapshot_save_preview_restore_idempotent(stack, tmp_path):
    target = stack.consul_target()
    admin = stack.admin()
    admin.kv.put("snap/keep", "original")
    admin.kv.put("snap/gone", "2")
    saved = snapshots.snapshot_save(snapshots.SnapshotSaveInput(consul=target, directory=str(tmp_path / "forensic")))
    path = Path(saved.path)
    assert path.is_file() and saved.size == path.stat().st_size > 0
    assert saved.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and saved.index > 0
    # A snapshot holds every ACL token: owner-only file in an owner-only directory.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    admin.kv.put("snap/keep", "changed")
    admin.kv.delete("snap/gone")
    admin.kv.put("snap/extra", "new")
    preview = snapshots.snapshot_preview(snapshots.SnapshotPreviewInput(consul=target, path=saved.path))
    assert not preview.in_sync
    assert "snap/keep" in preview.changed and "snap/gone" in preview.added and "snap/extra" in preview.removed
    assert preview.age_seconds >= 0 and preview.sha256 == saved.sha256
    out = snapshots.snapshot_restore(snapshots.SnapshotRestoreInput(consul=target, path=saved.path,
                                                                    expect_sha256=saved.sha256))
    assert out.restored and out.verified and "snap/keep" in out.preview.changed
    # Read back from the agent, not from the action's own preview: the changed key is as it was, the deleted
    # key came back, the key written since is gone, and nothing else is under the prefix.
    assert admin.kv.get("snap/keep")[1]["Value"] == b"original" and admin.kv.get("snap/extra")[1] is None
    assert admin.kv.get("snap/gone")[1]["Value"] == b"2"
    assert {e["Key"]: e["Value"] for e in admin.kv.get("snap/", recurse=True)[1]} == {
        "snap/keep": b"original", "snap/gone": b"2"}
    again = snapshots.snapshot_restore(snapshots.SnapshotRestoreInput(consul=target, path=saved.path))
    assert not again.restored and again.preview.in_sync
    with pytest.raises(ApplicationError) as err:
        snapshots.snapshot_restore(snapshots.SnapshotRestoreInput(consul=target, path=saved.path,
                                                                  expect_sha256="0" * 64))
    assert err.value.non_retryable


def test_snapshot_save_retry_reuses_its_file(stack, tmp_path):
    env = ActivityEnvironment()
    inp = snapshots.SnapshotSaveInput(consul=stack.consul_target(), directory=str(tmp_path))
    first = env.run(snapshots.snapshot_save, inp)
    second = env.run(snapshots.snapshot_save, inp)
    assert second.reused and second.path == first.path and second.sha256 == first.sha256
    assert len(list(tmp_path.glob("*.snap"))) == 1


def test_snapshot_select_picks_newest_before(stack, tmp_path):
    target = stack.consul_target()
    saved = []
    for _ in range(3):
        if saved:
            time.sleep(1.1)  # raft dates each snapshot by the server's wall clock, in milliseconds
        saved.append(snapshots.snapshot_save(snapshots.SnapshotSaveInput(consul=target, directory=str(tmp_path))))
    assert saved[0].taken_at < saved[1].taken_at < saved[2].taken_at
    for i, snap in enumerate(saved):  # newest file oldest on disk: select must go by the archive's own date
        os.utime(snap.path, (1_000_000 - i, 1_000_000 - i))
    (tmp_path / "torn.snap").write_bytes(b"\x1f\x8bgarbage")
    cut = saved[1].taken_at + (saved[2].taken_at - saved[1].taken_at) / 2
    out = snapshots.snapshot_select(snapshots.SnapshotSelectInput(store=str(tmp_path), before=cut))
    assert out.path == saved[1].path and out.taken_at == saved[1].taken_at
    assert out.considered == 4 and len(out.unreadable) == 1 and out.age_seconds > 0
    with pytest.raises(ApplicationError) as err:
        snapshots.snapshot_select(snapshots.SnapshotSelectInput(store=str(tmp_path), before=saved[0].taken_at))
    assert err.value.non_retryable and err.value.type == "NotFound"
    with pytest.raises(ApplicationError) as err:
        snapshots.snapshot_select(snapshots.SnapshotSelectInput(store=str(tmp_path), before=cut, max_age_seconds=0.5))
    assert err.value.non_retryable and err.value.type == "TooOld"
    assert saved[0].taken_at < datetime.now(UTC)


# --------------------------------------------------------------------------- health and leadership


def _kv_writes(stack, n: int = 30) -> None:
    """KV applies, so the leader's consul_kvs_apply summary has a p50."""
    admin = stack.admin()
    for i in range(n):
        admin.kv.put(f"health/apply/{i}", str(i))


def _health(target, **kw) -> leadership.HealthOutput:
    return leadership.health(leadership.HealthInput(consul=target, **kw))


def test_health_and_leader_transfer_across_three_servers(stack):
    target = stack.consul_target()
    _kv_writes(stack)
    # Autopilot counts a voter towards failure tolerance once it has been stable a while after start.
    before = stack.wait_until(lambda: (h := _health(target)).healthy and h.failure_tolerance == 1
                              and h.kv_apply_p50_ms is not None and h)
    assert sorted(before.voters) == ["consul1", "consul2", "consul3"] and before.leader in before.voters
    assert before.metrics_from_leader and before.metrics_node == before.leader and before.leader_id
    assert [s.reachable for s in before.servers] == [True, True, True] and before.unreachable == []
    assert [s.node for s in before.servers if s.leader] == [before.leader]
    assert before.autopilot_healthy and before.failure_tolerance == 1 and before.problems == []
    follower = next(v for v in before.voters if v != before.leader)
    noop = leadership.leader_transfer(leadership.LeaderTransferInput(consul=target, slow_servers=[follower]))
    assert not noop.changed and noop.leader == before.leader and noop.target is None
    moved = leadership.leader_transfer(leadership.LeaderTransferInput(consul=target, slow_servers=[before.leader]))
    assert moved.changed and moved.previous_leader == before.leader and moved.leader != before.leader
    assert moved.leader == moved.target
    assert not leadership.leader_transfer(
        leadership.LeaderTransferInput(consul=target, slow_servers=[before.leader])).changed
    _kv_writes(stack)
    after = stack.wait_until(lambda: (h := _health(target)).healthy and h.kv_apply_p50_ms is not None and h)
    assert after.leader == moved.leader and after.metrics_node == moved.leader and after.metrics_from_leader
    assert [s.node for s in after.servers if s.leader] == [moved.leader]
    _kv_writes(stack)
    as_json = stack.wait_until(lambda: (h := _health(target, metrics_format="json")).kv_apply_p50_ms is not None
                               and h)
    assert as_json.metrics_format == "json" and as_json.leader == moved.leader


def test_health_reports_an_unreachable_server_and_keeps_the_rest(stack):
    target = stack.consul_target(timeout_seconds=3)
    dead = "http://127.0.0.1:1"
    target = target.model_copy(update={"servers": [*stack.consul_urls[:2], dead]})
    out = _health(target)
    assert [s.url for s in out.servers] == [*stack.consul_urls[:2], dead]
    assert [s.reachable for s in out.servers] == [True, True, False] and out.unreachable == [dead]
    gone = out.servers[2]
    assert gone.node is None and not gone.leader and gone.error and "\n" not in gone.error
    assert out.leader in out.voters and len(out.voters) == 3 and out.autopilot_healthy
    assert not out.healthy and any(dead in p for p in out.problems)


def test_health_with_a_real_server_down(stack):
    if not stack.real:
        pytest.skip("needs a server process to stop: the stand-in serves its three servers from one process")
    local = stack.local
    target = stack.consul_target(timeout_seconds=3)
    whole = stack.wait_until(lambda: (h := _health(target)).healthy and h)
    victim = next(agent for agent in local.consuls if agent.node_name != whole.leader)
    proc = local.procs[victim.node_name]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        down = stack.wait_until(lambda: not (h := _health(target)).autopilot_healthy and h, timeout=30)
        by_url = {s.url: s for s in down.servers}
        assert down.unreachable == [victim.url] and not by_url[victim.url].reachable and by_url[victim.url].error
        assert all(s.reachable for url, s in by_url.items() if url != victim.url)
        assert down.leader == whole.leader and down.metrics_from_leader and down.metrics_node == whole.leader
        # Autopilot may already have cleaned the dead server out of the voters (seen under load).
        survivors = {"consul1", "consul2", "consul3"} - {victim.node_name}
        assert survivors <= set(down.voters) <= survivors | {victim.node_name} and down.failure_tolerance == 0
        assert not down.healthy and any(victim.url in p for p in down.problems)
        assert any("autopilot unhealthy" in p and victim.node_name in p for p in down.problems)
    finally:
        local._start(victim.node_name, victim.argv(local.found.consul, local.root / f"{victim.node_name}.json"))
        stack.wait_until(lambda: _health(target).healthy, timeout=40)


def test_slow_leader_fault_shows_in_health_and_transfer_clears_it(stack):
    stack.standin_only("the slow-leader fault and the fake clock that ages its metrics are stand-in hooks")
    lab = stack.consul
    target = stack.consul_target()
    leader = _health(target).leader
    lab.clock.advance(11)  # earlier tests' KV applies leave the agents' 10 s summary window
    try:
        lab.fault(fault="slow-leader", server=leader)
        lab.fault(fault="background-load", rps=100)
        lab.clock.advance(2)
        before = _health(target)
        assert before.leader == leader and before.metrics_from_leader
        assert before.kv_apply_p50_ms is not None and before.kv_apply_p50_ms > 300
        assert not before.autopilot_healthy and not before.healthy
        moved = leadership.leader_transfer(leadership.LeaderTransferInput(consul=target, slow_servers=[leader]))
        assert moved.changed and moved.leader != leader
        lab.clock.advance(2)
        after = _health(target)
        assert after.leader == moved.leader and after.metrics_node == moved.leader
        assert after.kv_apply_p50_ms is not None and after.kv_apply_p50_ms < 300
        assert after.autopilot_healthy and after.healthy, after.problems
    finally:
        lab.fault(fault="clear")


def test_failed_health_read_is_an_error(stack):
    target = stack.consul_target().model_copy(update={"address": "http://127.0.0.1:1", "servers": []})
    with pytest.raises(ApplicationError) as err:
        leadership.health(leadership.HealthInput(consul=target))
    assert not err.value.non_retryable and "no server answered" in str(err.value)


# --------------------------------------------------------------------------- non-essential usage

NS_PER_S = 1_000_000_000
# Short deployments: each register starts one, and the next change of the job waits it out.
FAST_UPDATE = {"MinHealthyTime": NS_PER_S, "HealthyDeadline": 20 * NS_PER_S, "ProgressDeadline": 30 * NS_PER_S}


def _sleep_job(name: str, count: int = 3) -> dict:
    sleep = shutil.which("sleep") or "/bin/sleep"
    return {"ID": name, "Name": name, "Type": "service", "Datacenters": ["dc1"], "Update": FAST_UPDATE,
            "TaskGroups": [{"Name": "web", "Count": count,
                            "Tasks": [{"Name": "t", "Driver": "raw_exec", "Resources": {"CPU": 20, "MemoryMB": 16},
                                       "Config": {"command": sleep, "args": ["infinity"]}}]}]}


def _check_definition(stack, name: str) -> dict:
    # A target that answers on both backends, so the check's status does not move while the test runs.
    return {"Name": f"{name} http", "ServiceID": name, "HTTP": f"{stack.consul_urls[0]}/v1/status/leader",
            "Method": "GET", "Header": {"X-Probe": [name]}, "Interval": "60s", "Timeout": "5s",
            "Notes": f"{name} liveness"}


def _arrange_services(stack, names: list[str], essential: set[str]) -> list[UserService]:
    """Per service: a usage flag, an agent-registered check (the inventory carries its definition), a Nomad job."""
    admin = stack.admin()
    api = stack.nomad_api()
    headers = {"X-Consul-Token": CONSUL_TOKEN}
    services = []
    for name in names:
        admin.kv.put(f"svc/{name}/consul-usage", "enabled", flags=1)
        httpx.put(f"{stack.consul_urls[0]}/v1/agent/service/register", headers=headers,
                  json={"Name": name, "ID": name, "Port": 8080}).raise_for_status()
        definition = _check_definition(stack, name)
        httpx.put(f"{stack.consul_urls[0]}/v1/agent/check/register", headers=headers,
                  json={**definition, "ID": f"{name}-http", "Status": "passing"}).raise_for_status()
        api.job.register_job(name, {"Job": _sleep_job(name)})
        services.append(UserService(name=name, tier="t2", essential=name in essential,
                                       usage_flag_key=f"svc/{name}/consul-usage", nomad_job=name,
                                       check_owner="agent", check_id=f"{name}-http", check_definition=definition))
    return services


def _observed(stack, names):
    admin = stack.admin()
    api = stack.nomad_api()
    checks = admin.agent.checks()
    out = {}
    for name in names:
        entry = admin.kv.get(f"svc/{name}/consul-usage")[1]
        chk = checks[f"{name}-http"]
        shown = {k: chk[k] for k in ("Name", "ServiceID", "Type", "Interval", "Timeout", "Notes", "Status")}
        out[name] = (entry["Value"], entry["Flags"], shown, api.job.get_job(name)["TaskGroups"][0]["Count"])
    return out


def _ns(duration: str) -> int:
    return round(go_duration_seconds(duration) * NS_PER_S)


def _assert_registered_as(stack, svc: UserService, interval: str) -> None:
    """The agent's own registration of the service's check (read from the agent, not from an action's answer)
    is the inventory's check_definition: the same HTTP target, method, headers, body and timeout, every
    `interval`."""
    d = svc.check_definition
    reg = stack.check_registration(svc.check_id)
    want = {"Name": d["Name"], "HTTP": d["HTTP"], "Method": d.get("Method", ""), "Header": d.get("Header"),
            "Body": d.get("Body", ""), "TCP": d.get("TCP", ""), "Notes": d.get("Notes", ""),
            "Timeout": _ns(d.get("Timeout", "0s")), "Interval": _ns(interval)}
    assert {k: reg[k] for k in want} == want, f"check {svc.check_id} as the agent has it registered"


def test_users_agent_checks_answer_like_real_consul(stack):
    """GET /v1/agent/checks as Consul 1.22.7 answers: no definition, Go durations at the top level."""
    headers = {"X-Consul-Token": CONSUL_TOKEN}
    url = stack.consul_urls[1]
    httpx.put(f"{url}/v1/agent/service/register", headers=headers, json={
        "Name": "shape", "ID": "shape", "Port": 81,
        "Checks": [{"TCP": "127.0.0.1:1", "Interval": "90s"}, {"TTL": "10s", "Name": "shape ttl"}]}).raise_for_status()
    httpx.put(f"{url}/v1/agent/check/register", headers=headers, json={
        "ID": "shape-http", "Name": "shape http", "ServiceID": "shape", "HTTP": "http://127.0.0.1:1/",
        "Method": "POST", "Header": {"X": ["y"]}, "Interval": "1h", "Timeout": "1500ms", "Notes": "n",
        "Status": "passing"}).raise_for_status()
    httpx.put(f"{url}/v1/agent/check/register", headers=headers,
              json={"ID": "shape-ttl", "Name": "shape ttl alone", "TTL": "30s"}).raise_for_status()
    checks = httpx.get(f"{url}/v1/agent/checks", headers=headers).raise_for_status().json()
    http = checks["shape-http"]
    assert list(http) == ["Node", "CheckID", "Name", "Status", "Notes", "Output", "ServiceID", "ServiceName",
                          "ServiceTags", "Type", "Interval", "Timeout", "ExposedPort", "Definition", "CreateIndex",
                          "ModifyIndex"]
    assert {k: http[k] for k in ("Node", "Status", "Notes", "ServiceName", "ServiceTags", "Type", "Interval", "Timeout",
                                 "ExposedPort", "Definition", "CreateIndex", "ModifyIndex")} == {
        "Node": "consul2", "Status": "passing", "Notes": "n", "ServiceName": "shape", "ServiceTags": [],
        "Type": "http", "Interval": "1h0m0s", "Timeout": "1.5s", "ExposedPort": 0, "Definition": {},
        "CreateIndex": 0, "ModifyIndex": 0}
    # No endpoint shows the target, method or headers: the catalog's view has no definition either.
    catalog = stack.wait_until(lambda: len(c := httpx.get(f"{url}/v1/health/checks/shape", headers=headers)
                                            .raise_for_status().json()) == 3 and c)  # anti-entropy syncs it
    assert sorted(c["CheckID"] for c in catalog) == ["service:shape:1", "service:shape:2", "shape-http"]
    assert all(c["Definition"] == {} for c in catalog)
    # The agent keeps them in its own record of the registration (CheckType; its data dir on a real agent).
    reg = stack.check_registration("shape-http", index=1)
    assert {k: reg[k] for k in ("CheckID", "Name", "Status", "Notes", "HTTP", "Method", "Header", "Body", "TCP",
                                "Interval", "Timeout", "TTL")} == {
        "CheckID": "shape-http", "Name": "shape http", "Status": "passing", "Notes": "n", "HTTP": "http://127.0.0.1:1/",
        "Method": "POST", "Header": {"X": ["y"]}, "Body": "", "TCP": "", "Interval": 3600 * NS_PER_S,
        "Timeout": 1_500_000_000, "TTL": 0}
    tcp = stack.check_registration("service:shape:1", index=1)
    assert (tcp["CheckID"], tcp["Name"], tcp["TCP"], tcp["HTTP"], tcp["Interval"]) == ("", "", "127.0.0.1:1", "",
                                                                                       90 * NS_PER_S)
    shown = {cid: (c["Type"], c["Interval"], c["Timeout"]) for cid, c in checks.items() if cid.startswith(
        ("service:shape", "shape-ttl"))}
    # Unset durations: "" in a service's own checks, "0s" in a check registered alone.
    assert shown == {"service:shape:1": ("tcp", "1m30s", ""), "service:shape:2": ("ttl", "", ""),
                     "shape-ttl": ("ttl", "0s", "0s")}
    # Re-registering an existing check keeps its status and output, whatever the body says.
    httpx.put(f"{url}/v1/agent/check/register", headers=headers, json={
        "ID": "shape-http", "Name": "shape http", "ServiceID": "shape", "HTTP": "http://127.0.0.1:1/",
        "Interval": "2h", "Status": "critical"}).raise_for_status()
    again = httpx.get(f"{url}/v1/agent/checks", headers=headers).json()["shape-http"]
    assert (again["Status"], again["Interval"], again["Timeout"], again["Notes"]) == ("passing", "2h0m0s", "0s", "")
    # ... while the registration is the new body's, field for field: no method, no headers any more.
    reg = stack.check_registration("shape-http", index=1)
    assert (reg["Status"], reg["Method"], reg["Header"], reg["Interval"], reg["Timeout"]) == (
        "critical", "", None, 7200 * NS_PER_S, 0)
    bad = httpx.put(f"{url}/v1/agent/check/register", headers=headers,
                    json={"ID": "shape-bad", "Name": "b", "HTTP": "http://127.0.0.1:1/"})
    assert (bad.status_code, bad.text) == (400, ("Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP, "
                                                 "UDP or OSService checks"))
    httpx.put(f"{url}/v1/agent/service/deregister/shape", headers=headers).raise_for_status()
    httpx.put(f"{url}/v1/agent/check/deregister/shape-ttl", headers=headers).raise_for_status()


def test_users_disable_then_enable_restores_exactly(stack):
    names = ["cart", "forum", "mail", "auth"]
    services = _arrange_services(stack, names, essential={"auth"})
    before = _observed(stack, names)
    inp = users.UsersDisableInput(consul=stack.consul_target(), nomad=stack.nomad_target(), services=services)
    out = ActivityEnvironment().run(users.users_disable, inp)
    assert sorted(out.disabled) == ["cart", "forum", "mail"] and out.skipped_essential == ["auth"]
    assert out.changed == {name: ["flag", "check", "scale"] for name in ("cart", "forum", "mail")}
    during = _observed(stack, names)
    for name in ("cart", "forum", "mail"):
        value, flags, check, count = during[name]
        assert (value, flags, count) == (b"disabled", 1, 1)
        assert check == {**before[name][2], "Interval": "10m0s"}  # status, timeout, notes as they were
    assert during["auth"] == before["auth"]
    for svc in services:  # target, method and headers as the inventory has them; only the interval stretched
        _assert_registered_as(stack, svc, svc.check_definition["Interval"] if svc.essential else "10m")
    second = users.users_disable(inp)
    assert second.changed == {} and second.restore.records == out.restore.records  # journal kept the originals
    enabled = users.users_enable(out.restore)
    assert enabled.changed == {name: ["flag", "check", "scale"] for name in ("cart", "forum", "mail")}
    assert _observed(stack, names) == before
    for svc in services:
        _assert_registered_as(stack, svc, svc.check_definition["Interval"])
    assert stack.admin().kv.get("coldstart/journal/users/", recurse=True)[1] is None
    assert users.users_enable(out.restore).changed == {}
    assert CONSUL_TOKEN not in dump(out) + dump(enabled)


def test_user_disable_per_service_and_crash_safe_record(stack):
    [svc] = _arrange_services(stack, ["search"], essential=set())
    inp = users.UserDisableInput(consul=stack.consul_target(), nomad=stack.nomad_target(), service=svc, scale_to=2)
    first = users.user_disable(inp)
    assert first.changed == ["flag", "check", "scale"]
    _assert_registered_as(stack, svc, "10m")
    assert first.record.flag.previous.value_base64 == "ZW5hYmxlZA=="  # "enabled"
    assert first.record.scale.count == 3 and first.record.check.owner == "agent"
    assert first.record.check.definition == svc.check_definition and first.record.check.interval == "60s"
    # A retry (or a second runbook run) must not record the disabled state as the original.
    again = users.user_disable(inp)
    assert again.changed == [] and again.record == first.record
    back = users.user_enable(again.restore)
    assert back.changed == ["flag", "check", "scale"]
    entry = stack.admin().kv.get("svc/search/consul-usage")[1]
    assert entry["Value"] == b"enabled" and entry["Flags"] == 1
    assert stack.nomad_api().job.get_job("search")["TaskGroups"][0]["Count"] == 3
    assert stack.admin().agent.checks()["search-http"]["Interval"] == "1m0s"
    _assert_registered_as(stack, svc, "60s")


def test_users_disable_partial_failure_reports_and_restores_every_change(stack):
    names = ["billing", "gifts"]
    services = _arrange_services(stack, names, essential=set())
    before = _observed(stack, names)
    api = stack.nomad_api()
    target = stack.consul_target()
    # An earlier attempt recorded "gifts" (the journal); its job is then briefly gone (being redeployed).
    record = users.ServiceRecord(
        name="gifts", tier="t2",
        flag=users.FlagRecord(key="svc/gifts/consul-usage", previous=KvEntry(key="svc/gifts/consul-usage",
                                                                              value_base64="ZW5hYmxlZA==", flags=1)),
        check=users.AgentCheckRecord(agent=target.address, check_id="gifts-http", interval="60s",
                                  definition=_check_definition(stack, "gifts")),
        scale=users.ScaleRecord(job="gifts", group="web", namespace="default", count=3))
    stack.admin().kv.put("coldstart/journal/users/gifts", record.model_dump_json())
    api.job.deregister_job("gifts", purge=True)
    inp = users.UsersDisableInput(consul=target, nomad=stack.nomad_target(), services=services)
    with pytest.raises(ApplicationError) as err:
        users.users_disable(inp)
    exc = err.value
    assert exc.type == "PartialFailure" and exc.non_retryable  # the job is not found: a retry cannot help
    assert "billing (flag, check, scale), gifts (flag, check)" in str(exc) and "\n" not in str(exc)
    details = exc.details[0]
    assert details["changed"] == {"billing": ["flag", "check", "scale"], "gifts": ["flag", "check"]}
    assert "not found" in details["failed"]["gifts"] and "changed flag, check, then failed" in details["failed"]["gifts"]
    restore = users.UsersEnableInput.model_validate(details["restore"])
    assert [r.name for r in restore.records] == ["billing", "gifts"] and restore.records[1] == record
    # Retried alone: this call changes nothing new, says so, and still hands back the way to the original.
    with pytest.raises(ApplicationError) as err:
        users.user_disable(users.UserDisableInput(consul=target, nomad=stack.nomad_target(), service=services[1]))
    assert "consul.user.disable gifts: changed nothing, then failed" in str(err.value)
    assert err.value.details[0]["changed"] == []
    assert users.UserEnableInput.model_validate(err.value.details[0]["restore"]).record == record
    api.job.register_job("gifts", {"Job": _sleep_job("gifts")})  # the job is back
    enabled = users.users_enable(restore)
    assert enabled.changed == {"billing": ["flag", "check", "scale"], "gifts": ["flag", "check"]}
    assert _observed(stack, names) == before
    for svc in services:
        _assert_registered_as(stack, svc, "60s")


def test_user_disable_refuses_a_check_the_inventory_no_longer_describes(stack):
    [svc] = _arrange_services(stack, ["drift"], essential=set())
    # Someone re-registered the check since the inventory was written: other notes, another timeout.
    httpx.put(f"{stack.consul_urls[0]}/v1/agent/check/register", headers={"X-Consul-Token": CONSUL_TOKEN},
              json={**svc.check_definition, "ID": svc.check_id, "Notes": "by hand", "Timeout": "2s"}
              ).raise_for_status()
    inp = users.UserDisableInput(consul=stack.consul_target(), nomad=stack.nomad_target(), service=svc,
                                 journal_prefix=None)
    with pytest.raises(ApplicationError) as err:
        users.user_disable(inp)
    assert err.value.type == "Conflict" and err.value.non_retryable
    assert (
        f"check drift-http on agent {stack.consul_urls[0]} differs from the inventory's check_definition (Notes: "
        "want 'drift liveness', agent has 'by hand'; Timeout: want '5s', agent has '2s'): the inventory is out "
        "of date; not re-registering the check from it") in str(err.value)
    live = stack.admin().agent.checks()["drift-http"]
    assert (live["Interval"], live["Notes"]) == ("1m0s", "by hand")  # left as it was
    assert stack.check_registration("drift-http")["Timeout"] == 2 * NS_PER_S


def test_user_service_says_who_owns_the_check():
    ok = {"name": "svc", "nomad_job": "svc"}
    assert UserService(**ok, check_owner="nomad").check_service is None
    for bad, why in [({"check_owner": "nomad", "nomad_job": None}, "needs nomad_job"),
                     ({"check_owner": "agent", "check_id": "c"}, "needs check_id and check_definition"),
                     ({"check_owner": "agent", "check_id": "c", "check_definition": {"TTL": "10s"}}, "Interval"),
                     ({"check_owner": "agent", "check_id": "c", "check_definition": {"ID": "c", "Interval": "5s"}},
                      "carries no ID"),
                     ({"check_owner": "agent", "check_id": "c", "check_definition": {"Interval": "5s"}}, "Name"),
                     ({"check_id": "c"}, "only apply with check_owner: agent"),
                     ({"check_owner": "agent", "check_id": "c", "check_definition": {"Interval": "5s"},
                       "check_name": "x"}, "only apply with check_owner: nomad")]:
        with pytest.raises(ValueError, match=why):
            UserService(**{**ok, **bad})


# --------------------------------------------------------------------------- the lab's services (Nomad-owned checks)


def _lab_cleanup(stack) -> None:
    from lab.users import LAB_USERS

    api = stack.nomad_api()
    for user in LAB_USERS:
        with contextlib.suppress(Exception):  # not registered
            api.job.deregister_job(user.name, purge=True)
    admin = stack.admin()
    admin.kv.delete("coldstart/usage/", recurse=True)
    admin.kv.delete("coldstart/journal/users/", recurse=True)
    if stack.real:  # Nomad deregisters the services from Consul as the allocations stop
        stack.wait_until(lambda: not any(admin.health.checks(u.name)[1] for u in LAB_USERS), timeout=20)


def _lab_register(stack, interval: str) -> list[UserService]:
    from lab.settings import LabConfig
    from lab.users import register_users, user_services

    cfg = LabConfig()
    register_users(cfg, CONSUL_TOKEN, consul_url=stack.consul_urls[0], nomad_url=stack.nomad_url,
                   datacenter="dc1", check_interval=interval)
    return [UserService.model_validate(s.model_dump()) for s in user_services(cfg)]


def _lab_check(stack, name: str) -> dict:
    group = stack.nomad_api().job.get_job(name)["TaskGroups"][0]
    [service] = group["Services"]
    [check] = service["Checks"]
    return check


def test_users_disable_lab_services_stretch_the_check_in_the_nomad_job(stack):
    _lab_cleanup(stack)
    try:
        services = _lab_register(stack, "2s")
        names = [s.name for s in services if not s.essential]
        original = {s.name: _lab_check(stack, s.name) for s in services}
        assert all(c["Interval"] == 2 * NS_PER_S and c["Type"] == "http" for c in original.values())
        inp = users.UsersDisableInput(consul=stack.consul_target(), nomad=stack.nomad_target(), services=services)
        out = users.users_disable(inp)
        assert sorted(out.changed) == sorted(names) and all(v == ["flag", "check", "scale"]
                                                            for v in out.changed.values())
        versions = {}
        for svc in services:
            job = stack.nomad_api().job.get_job(svc.name)
            check = job["TaskGroups"][0]["Services"][0]["Checks"][0]
            if svc.essential:
                assert check == original[svc.name] and job["TaskGroups"][0]["Count"] == 3
                continue
            versions[svc.name] = job["Version"]
            assert check["Interval"] == 600 * NS_PER_S and job["TaskGroups"][0]["Count"] == 1
            assert check["OnUpdate"] == "ignore"
            stretched = ("Interval", "InitialStatus", "OnUpdate")  # all else stays as the job had it
            assert {k: v for k, v in check.items() if k not in stretched} == {
                k: v for k, v in original[svc.name].items() if k not in stretched}
        rec = next(r for r in out.restore.records if r.name == "chat")
        assert rec.check.owner == "nomad" and rec.check.definition == original["chat"]
        assert (rec.check.place.group, rec.check.place.task, rec.check.place.service, rec.check.place.check) == (
            "app", None, "chat", "chat http")
        enabled = users.users_enable(out.restore)
        assert sorted(enabled.changed) == sorted(names)
        for svc in services:
            job = stack.nomad_api().job.get_job(svc.name)
            assert job["TaskGroups"][0]["Services"][0]["Checks"][0] == original[svc.name]  # every field
            assert job["TaskGroups"][0]["Count"] == 3
            if not svc.essential:
                assert job["Version"] == versions[svc.name] + 1  # check and count in one version each way
    finally:
        _lab_cleanup(stack)


def test_users_disable_lab_services_consul_follows_the_nomad_job(stack):
    if not stack.real:
        pytest.skip("the stand-in Nomad does not run Nomad's Consul service sync: job service blocks never reach "
                    "the stand-in Consul")
    admin = stack.admin()
    api = stack.nomad_api()

    def consul_checks(name: str) -> list[dict]:
        return admin.health.checks(name)[1]

    _lab_cleanup(stack)
    try:
        services = [s for s in _lab_register(stack, "2s") if s.name in ("chat", "matchmaker")]
        # Three instances each, their checks passing (the tiny server answers on the allocated port).
        stack.wait_until(lambda: all(len(c := consul_checks(s.name)) == 3 and all(x["Status"] == "passing" for x in c)
                                     for s in services), timeout=30)
        inp = users.UsersDisableInput(consul=stack.consul_target(), nomad=stack.nomad_target(), services=services)
        out = users.users_disable(inp)
        assert out.changed == {"chat": ["flag", "check", "scale"]}
        # The check Nomad re-registers runs every 10 min and starts as it was (passing), not critical.
        stretched = stack.wait_until(lambda: (c := consul_checks("chat")) and len(c) == 1
                                     and c[0]["Interval"] == "10m0s" and c, timeout=20)
        assert stretched[0]["Status"] == "passing" and stretched[0]["Timeout"] == "5s"
        check = api.job.get_job("chat")["TaskGroups"][0]["Services"][0]["Checks"][0]
        assert (check["InitialStatus"], check["OnUpdate"]) == ("passing", "ignore")
        # So the deployment of the disabled version succeeds instead of waiting on a check 10 min away.
        stack.wait_until(lambda: api.job.get_deployment("chat")["Status"] == "successful", timeout=25)
        assert all(c["Interval"] == "2s" for c in consul_checks("matchmaker"))
        users.users_enable(out.restore)
        stack.wait_until(lambda: (c := consul_checks("chat")) and len(c) == 3
                         and all(x["Interval"] == "2s" for x in c), timeout=25)
    finally:
        _lab_cleanup(stack)
