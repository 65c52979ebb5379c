"""Consul actions against the 3-server stand-in with ACLs on, the token coming from the Vault stand-in."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import consul
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import consul as ca
from activities._clients import ConsulTarget

from .conftest import CONSUL_TOKEN


def dump(model) -> str:
    return json.dumps(model.model_dump(mode="json"))


def test_kv_set_is_cas_idempotent_and_undoes(stack):
    target = stack.consul_target()
    admin = stack.admin()
    admin.kv.put("app/mode", "normal", flags=7)
    out = ca.kv_set(ca.KvSetInput(consul=target, key="app/mode", value="degraded"))
    assert out.changed and out.previous_value == "normal" and out.previous.flags == 7
    assert admin.kv.get("app/mode")[1]["Value"] == b"degraded"
    again = ca.kv_set(ca.KvSetInput(consul=target, key="app/mode", value="degraded"))
    assert not again.changed and again.modify_index == out.modify_index
    back = ca.kv_set(out.undo)
    assert back.changed
    entry = admin.kv.get("app/mode")[1]
    assert entry["Value"] == b"normal" and entry["Flags"] == 7
    assert not ca.kv_set(out.undo).changed  # undo retried after success: nothing to do
    created = ca.kv_set(ca.KvSetInput(consul=target, key="app/new", value="x"))
    assert created.previous is None and created.undo.delete
    ca.kv_set(created.undo)
    assert admin.kv.get("app/new")[1] is None
    assert CONSUL_TOKEN not in dump(out) + dump(created)


def test_kv_undo_refuses_to_clobber_a_newer_write(stack):
    target = stack.consul_target()
    out = ca.kv_set(ca.KvSetInput(consul=target, key="app/race", value="ours"))
    stack.admin().kv.put("app/race", "theirs")
    with pytest.raises(ApplicationError) as err:
        ca.kv_set(out.undo)
    assert err.value.non_retryable and "changed since" in str(err.value)
    assert stack.admin().kv.get("app/race")[1]["Value"] == b"theirs"


def test_streaming_flag_set_and_undo(stack):
    target = stack.consul_target()
    stack.admin().kv.put("coldstart/flags/streaming", "true")
    out = ca.streaming_set(ca.StreamingSetInput(consul=target, enabled=False))
    assert out.changed and out.previous_value == "true"
    assert stack.consul.cluster.streaming() is False
    assert not ca.streaming_set(ca.StreamingSetInput(consul=target, enabled=False)).changed
    ca.kv_set(out.undo)
    assert stack.consul.cluster.streaming() is True
    ca.streaming_set(ca.StreamingSetInput(consul=target, enabled=False))


def test_delete_prefix_records_and_restore_puts_back_exactly(stack):
    target = stack.consul_target()
    admin = stack.admin()
    want = {"cache/scheduling/a": (b"1", 0), "cache/scheduling/b": (b"\x00\xffbin", 3), "cache/scheduling/c/d": (b"x", 0)}
    for k, (v, f) in want.items():
        admin.kv.put(k, v, flags=f)
    admin.kv.put("cache/schedulingX", "keep")
    out = ca.kv_delete_prefix(ca.KvDeletePrefixInput(consul=target, prefix="cache/scheduling/"))
    assert out.count == 3 and sorted(e.key for e in out.deleted) == sorted(want)
    assert admin.kv.get("cache/scheduling/", recurse=True)[1] is None
    assert admin.kv.get("cache/schedulingX")[1]["Value"] == b"keep"
    assert ca.kv_delete_prefix(ca.KvDeletePrefixInput(consul=target, prefix="cache/scheduling/")).count == 0
    restored = ca.kv_restore(out.undo)
    assert sorted(restored.restored) == sorted(want)
    for k, (v, f) in want.items():
        entry = admin.kv.get(k)[1]
        assert (entry["Value"], entry["Flags"]) == (v, f)
    assert ca.kv_restore(out.undo).restored == []  # second undo: nothing to do


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
    out = env.run(ca.kv_delete_prefix, ca.KvDeletePrefixInput(consul=target, prefix="sched2/"))
    assert [e.key for e in out.deleted] == ["sched2/a", "sched2/b"]


def test_bad_arguments_are_non_retryable(stack):
    target = stack.consul_target()
    for fn, inp in [
        (ca.kv_set, {"consul": target.model_dump(), "key": "k", "value": "v", "delete": True}),
        (ca.kv_delete_prefix, {"consul": target.model_dump(), "prefix": "/"}),
        (ca.leader_transfer, {"consul": target.model_dump(), "slow_servers": ["nope"]}),
        (ca.snapshot_select, {"store": "/nonexistent", "before": "2021-10-28T00:00:00"}),
        (ca.health, {"consul": {"address": "not a url"}}),
    ]:
        with pytest.raises(ApplicationError) as err:
            fn(inp)
        assert err.value.non_retryable, (fn, str(err.value))
        assert "\n" not in str(err.value)


def test_secret_never_leaks_and_vault_token_wins_over_env(stack, monkeypatch):
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "wrong-env-token")
    target = stack.consul_target()
    out = ca.kv_set(ca.KvSetInput(consul=target, key="leak/check", value="v"))
    assert CONSUL_TOKEN not in dump(out) and "wrong-env-token" not in dump(out)
    # A wrong secret path and an unreachable agent: the errors name neither token.
    broken = target.model_copy(update={"token": stack.token_ref("coldstart/missing")})
    for inp in (ca.KvSetInput(consul=broken, key="x", value="v"),
                ca.KvSetInput(consul=target.model_copy(update={"address": "http://127.0.0.1:1"}), key="x", value="v")):
        with pytest.raises(ApplicationError) as err:
            ca.kv_set(inp)
        text = str(err.value) + repr(err.value.details)
        assert CONSUL_TOKEN not in text and "root-token" not in text
    no_token = ConsulTarget(address=target.address)
    with pytest.raises(ApplicationError) as err:
        ca.kv_set(ca.KvSetInput(consul=no_token, key="x", value="v"))
    assert err.value.type == "PermissionDenied" and err.value.non_retryable


# --------------------------------------------------------------------------- snapshots


def test_snapshot_save_preview_restore_idempotent(stack, tmp_path):
    target = stack.consul_target()
    admin = stack.admin()
    admin.kv.put("snap/keep", "original")
    admin.kv.put("snap/gone", "2")
    saved = ca.snapshot_save(ca.SnapshotSaveInput(consul=target, directory=str(tmp_path / "forensic")))
    path = Path(saved.path)
    assert path.is_file() and saved.size == path.stat().st_size > 0
    assert saved.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and saved.index > 0
    admin.kv.put("snap/keep", "changed")
    admin.kv.delete("snap/gone")
    admin.kv.put("snap/extra", "new")
    preview = ca.snapshot_preview(ca.SnapshotPreviewInput(consul=target, path=saved.path))
    assert not preview.in_sync
    assert "snap/keep" in preview.changed and "snap/gone" in preview.added and "snap/extra" in preview.removed
    assert preview.age_seconds >= 0 and preview.sha256 == saved.sha256
    out = ca.snapshot_restore(ca.SnapshotRestoreInput(consul=target, path=saved.path, expect_sha256=saved.sha256))
    assert out.restored and out.verified and "snap/keep" in out.preview.changed
    assert admin.kv.get("snap/keep")[1]["Value"] == b"original" and admin.kv.get("snap/extra")[1] is None
    again = ca.snapshot_restore(ca.SnapshotRestoreInput(consul=target, path=saved.path))
    assert not again.restored and again.preview.in_sync
    with pytest.raises(ApplicationError) as err:
        ca.snapshot_restore(ca.SnapshotRestoreInput(consul=target, path=saved.path, expect_sha256="0" * 64))
    assert err.value.non_retryable


def test_snapshot_save_retry_reuses_its_file(stack, tmp_path):
    env = ActivityEnvironment()
    inp = ca.SnapshotSaveInput(consul=stack.consul_target(), directory=str(tmp_path))
    first = env.run(ca.snapshot_save, inp)
    second = env.run(ca.snapshot_save, inp)
    assert second.reused and second.path == first.path and second.sha256 == first.sha256
    assert len(list(tmp_path.glob("*.snap"))) == 1


def test_snapshot_select_picks_newest_before(stack, tmp_path):
    target = stack.consul_target()
    saved = []
    for _ in range(3):
        if saved:
            time.sleep(1.1)  # raft dates each snapshot by the server's wall clock, in milliseconds
        saved.append(ca.snapshot_save(ca.SnapshotSaveInput(consul=target, directory=str(tmp_path))))
    assert saved[0].taken_at < saved[1].taken_at < saved[2].taken_at
    for i, snap in enumerate(saved):  # newest file oldest on disk: select must go by the archive's own date
        os.utime(snap.path, (1_000_000 - i, 1_000_000 - i))
    (tmp_path / "torn.snap").write_bytes(b"\x1f\x8bgarbage")
    cut = saved[1].taken_at + (saved[2].taken_at - saved[1].taken_at) / 2
    out = ca.snapshot_select(ca.SnapshotSelectInput(store=str(tmp_path), before=cut))
    assert out.path == saved[1].path and out.taken_at == saved[1].taken_at
    assert out.considered == 4 and len(out.unreadable) == 1 and out.age_seconds > 0
    with pytest.raises(ApplicationError) as err:
        ca.snapshot_select(ca.SnapshotSelectInput(store=str(tmp_path), before=saved[0].taken_at))
    assert err.value.non_retryable and err.value.type == "NotFound"
    with pytest.raises(ApplicationError) as err:
        ca.snapshot_select(ca.SnapshotSelectInput(store=str(tmp_path), before=cut, max_age_seconds=0.5))
    assert err.value.non_retryable and err.value.type == "TooOld"
    assert saved[0].taken_at < datetime.now(timezone.utc)


# --------------------------------------------------------------------------- health and leadership


def test_health_and_leader_transfer_off_a_slow_leader(stack):
    lab = stack.consul
    target = stack.consul_target()
    try:
        lab.fault(fault="slow-leader", server="consul1")
        lab.fault(fault="background-load", rps=100)
        lab.clock.advance(2)
        before = ca.health(ca.HealthInput(consul=target))
        assert before.leader == "consul1" and before.metrics_from_leader
        assert before.voters == ["consul1", "consul2", "consul3"]
        assert before.kv_apply_p50_ms is not None and before.kv_apply_p50_ms > 300
        assert not before.autopilot_healthy and not before.healthy
        noop = ca.leader_transfer(ca.LeaderTransferInput(consul=target, slow_servers=["consul3"]))
        assert not noop.changed and noop.leader == "consul1"
        moved = ca.leader_transfer(ca.LeaderTransferInput(consul=target, slow_servers=["consul1"]))
        assert moved.changed and moved.previous_leader == "consul1" and moved.leader != "consul1"
        assert not ca.leader_transfer(ca.LeaderTransferInput(consul=target, slow_servers=["consul1"])).changed
        lab.clock.advance(2)
        after = ca.health(ca.HealthInput(consul=target))
        assert after.leader == moved.leader and after.metrics_node == moved.leader
        assert after.kv_apply_p50_ms is not None and after.kv_apply_p50_ms < 300
        assert after.autopilot_healthy and after.healthy, after.problems
        as_json = ca.health(ca.HealthInput(consul=target, metrics_format="json"))
        assert as_json.metrics_format == "json" and as_json.kv_apply_p50_ms is not None
    finally:
        lab.fault(fault="clear")


def test_failed_health_read_is_an_error(stack):
    target = stack.consul_target().model_copy(update={"address": "http://127.0.0.1:1", "servers": []})
    with pytest.raises(ApplicationError) as err:
        ca.health(ca.HealthInput(consul=target))
    assert not err.value.non_retryable


# --------------------------------------------------------------------------- non-essential usage


def _arrange_services(stack, names: list[str], essential: set[str]) -> list[ca.UserService]:
    admin = stack.admin()
    nomad_state = stack.nomad.state
    services = []
    for name in names:
        admin.kv.put(f"svc/{name}/consul-usage", "enabled", flags=1)
        admin.agent.service.register(name, service_id=name, port=8080, token=CONSUL_TOKEN)
        check = consul.Check.http(f"http://127.0.0.1:9/{name}", "60s", timeout="5s")
        check["Status"] = "passing"
        admin.agent.check.register(f"{name} http", check=check, check_id=f"{name}-http", service_id=name,
                                   token=CONSUL_TOKEN)
        stack.nomad.server.call(_register(nomad_state, name))
        services.append(ca.UserService(name=name, tier="t2", essential=name in essential,
                                       usage_flag_key=f"svc/{name}/consul-usage", check_id=f"{name}-http",
                                       nomad_job=name))
    return services


async def _register(state, name):
    state.register({"ID": name, "TaskGroups": [{"Name": "web", "Count": 3,
                                                 "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]})


def _observed(stack, names):
    admin = stack.admin()
    checks = admin.agent.checks(token=CONSUL_TOKEN)
    out = {}
    for name in names:
        entry = admin.kv.get(f"svc/{name}/consul-usage")[1]
        chk = checks[f"{name}-http"]
        job = stack.nomad.state.jobs[f"default/{name}"]
        # Key case is the agent's business (real Consul normalizes it); the values must match exactly.
        definition = {k.lower(): v for k, v in chk["Definition"].items()}
        out[name] = (entry["Value"], entry["Flags"], definition, chk["Status"], job["TaskGroups"][0]["Count"])
    return out


def test_users_disable_then_enable_restores_exactly(stack):
    names = ["cart", "avatar", "chat", "auth"]
    services = _arrange_services(stack, names, essential={"auth"})
    before = _observed(stack, names)
    inp = ca.UsersDisableInput(consul=stack.consul_target(), nomad=stack.nomad_target(), services=services)
    out = ActivityEnvironment().run(ca.users_disable, inp)
    assert sorted(out.disabled) == ["avatar", "cart", "chat"] and out.skipped_essential == ["auth"]
    assert sorted(out.changed) == ["avatar", "cart", "chat"]
    during = _observed(stack, names)
    for name in ("cart", "avatar", "chat"):
        value, _, definition, status, count = during[name]
        assert value == b"disabled" and count == 1 and status == "passing"
        assert consul_interval(definition) == "10m"
    assert during["auth"] == before["auth"]
    second = ca.users_disable(inp)
    assert second.changed == [] and second.restore.records == out.restore.records  # journal kept the originals
    enabled = ca.users_enable(out.restore)
    assert sorted(enabled.changed) == ["avatar", "cart", "chat"]
    assert _observed(stack, names) == before
    assert stack.admin().kv.get("coldstart/journal/users/", recurse=True)[1] is None
    assert ca.users_enable(out.restore).changed == []
    assert CONSUL_TOKEN not in dump(out) + dump(enabled)


def consul_interval(definition: dict) -> str:
    return next(v for k, v in definition.items() if k.lower() == "interval")


def test_user_disable_per_service_and_crash_safe_record(stack):
    [svc] = _arrange_services(stack, ["search"], essential=set())
    inp = ca.UserDisableInput(consul=stack.consul_target(), nomad=stack.nomad_target(), service=svc, scale_to=2)
    first = ca.user_disable(inp)
    assert set(first.changed) == {"flag", "check", "scale"}
    assert first.record.flag.previous.value_base64 == "ZW5hYmxlZA=="  # "enabled"
    assert first.record.scale.count == 3 and first.record.check.interval == "60s"
    # A retry (or a second runbook run) must not record the disabled state as the original.
    again = ca.user_disable(inp)
    assert again.changed == [] and again.record == first.record
    back = ca.user_enable(again.restore)
    assert set(back.changed) == {"flag", "check", "scale"}
    entry = stack.admin().kv.get("svc/search/consul-usage")[1]
    assert entry["Value"] == b"enabled" and entry["Flags"] == 1
    assert stack.nomad.state.jobs["default/search"]["TaskGroups"][0]["Count"] == 3
