"""Unit tests for the steering record codec, argument validation, Vault reads and lab config rendering."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from activities.contracts.dns import SteerSampleInput, SteerSetInput, ecs_subnets, parse_server
from activities.dns.actions import steer_set
from activities.dns.steering import SCALE, decode_lua_rdata, encode_lua_rdata, parse_steering_code, steering_code
from activities.registry import default_registry
from activities.secrets import VaultSecretRef, read_kv_secret, use_client_factory
from lab.dns import PdnsPaths, PdnsSettings, launch_spec, render_policy
from tests.dns.support import GAME_IP, MAINT_IP, FakeVault, secret_ref

ZONE = "play.coldstart.lab."


def _set_fields(**overrides: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "zone": ZONE, "name": "play", "servers": ["127.0.0.1:5353"], "game_ip": GAME_IP, "maint_ip": MAINT_IP,
        "percent": 30, "tsig_key_name": "coldstart-steer.", "tsig_secret": secret_ref(),
    }
    fields.update(overrides)
    return fields


def test_code_round_trips_and_weights_scale_by_100() -> None:
    code = steering_code(GAME_IP, MAINT_IP, 30)
    assert code == "pickwhashed({{3000,'10.20.0.10'},{7000,'10.20.0.99'}})"
    assert '"' not in code  # the presentation form wraps the code in double quotes
    steering = parse_steering_code(code)
    assert steering is not None and steering.percent == 30 and steering.weight + (SCALE - 3000) == SCALE
    assert parse_steering_code("os.execute('x')") is None
    assert parse_steering_code("pickwhashed({{3000,'10.20.0.10'},{6000,'10.20.0.99'}})") is None


def test_lua_rdata_wire_is_type_then_character_strings() -> None:
    long_code = "x" * 300
    rdata = encode_lua_rdata("A", long_code)
    assert rdata.data[:2] == b"\x00\x01" and rdata.data[2] == 255
    assert decode_lua_rdata(rdata) == ("A", long_code)


def test_parse_server() -> None:
    assert parse_server("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_server("[::1]:53") == ("::1", 53)
    assert parse_server("192.0.2.1") == ("192.0.2.1", 53)
    for bad in ("ns1.example:53", "127.0.0.1:0", "127.0.0.1:x"):
        with pytest.raises(ValueError):
            parse_server(bad)


@pytest.mark.parametrize(
    "override",
    [
        {"percent": 101},
        {"percent": -1},
        {"name": "play.elsewhere.lab."},
        {"servers": []},
        {"servers": ["dns.example:53"]},
        {"servers": ["127.0.0.1:53", "127.0.0.1:53"]},
        {"game_ip": MAINT_IP},
        {"game_ip": "::1"},
    ],
)
async def test_bad_arguments_are_non_retryable(override: dict[str, object]) -> None:
    fields = _set_fields(**override)
    with pytest.raises(ValidationError):
        SteerSetInput(**fields)
    # However the bad input arrives, the activity refuses once instead of being retried.
    with pytest.raises(ApplicationError) as err:
        await steer_set(SteerSetInput.model_construct(**fields))
    assert err.value.non_retryable and err.value.type == "InvalidArgument"
    assert "bad arguments for dns.steer.set (SteerSetInput)" in str(err.value)


def test_sample_input_checks_subnet_room() -> None:
    with pytest.raises(ValidationError):
        SteerSampleInput(server="127.0.0.1:53", name="play.play.coldstart.lab.", game_ip=GAME_IP,
                         clients=300, ecs_base="10.0.0.0/16", ecs_prefix=24)
    nets = ecs_subnets("10.0.0.0/8", 24, 3)
    assert [str(n) for n in nets] == ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24"]


def test_actions_registered() -> None:
    for name, mutating in (("dns.steer.set", True), ("dns.steer.get", False), ("dns.steer.sample", False)):
        spec = default_registry.get(name)
        assert spec is not None and spec.mutating is mutating
    spec = default_registry.get("dns.steer.set")
    assert spec is not None and (spec.undo, spec.undo_from_output) == ("dns.steer.set", "undo")


def test_vault_read_uses_token_and_never_leaks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeVault("c2VjcmV0")
    monkeypatch.delenv("VAULT_TOKEN", raising=False)
    with use_client_factory(fake.factory):
        with pytest.raises(ApplicationError) as err:
            read_kv_secret(secret_ref())
        assert err.value.non_retryable and "VAULT_TOKEN" in str(err.value)

        token_file = tmp_path / "token"
        token_file.write_text("file-token\n")
        ref = secret_ref().model_copy(update={"token_file": str(token_file)})
        assert read_kv_secret(ref) == "c2VjcmV0"
        assert fake.calls[0]["token"] == "file-token"
        assert fake.calls[1] == {
            "path": "coldstart/dns-tsig", "mount_point": "secret", "raise_on_deleted_version": True
        }

        missing = ref.model_copy(update={"field": "nope"})
        with pytest.raises(ApplicationError) as err:
            read_kv_secret(missing)
        assert err.value.non_retryable and "c2VjcmV0" not in str(err.value)
    with pytest.raises(ValidationError):
        VaultSecretRef(address="vault:8200", path="p", field="f")


def test_conf_and_argv(tmp_path: Path) -> None:
    settings = PdnsSettings(bind_address="10.99.0.53", port=53, axfr_from=("10.99.0.0/24",))
    spec = launch_spec(settings, PdnsPaths(tmp_path))
    assert spec.argv == ["/usr/sbin/pdns_server", f"--config-dir={tmp_path}"]
    conf = dict(line.split("=", 1) for line in spec.conf_text.splitlines() if "=" in line)
    assert conf["local-address"] == "10.99.0.53:53"
    assert conf["socket-dir"] == str(tmp_path)
    assert (conf["daemon"], conf["guardian"]) == ("no", "no")
    assert conf["enable-lua-records"] == "shared" and conf["edns-subnet-processing"] == "yes"
    assert conf["dnsupdate"] == "yes" and conf["launch"] == "gsqlite3"
    assert conf["allow-axfr-ips"] == "10.99.0.0/24"


def test_policy_names_only_what_it_allows() -> None:
    script = render_policy(key_name="K.", zone="Z.lab.", names=("Play.Z.lab.",))
    assert 'local KEY = "k."' in script and 'local ZONE = "z.lab."' in script
    assert '["play.z.lab."] = true' in script and "65402" in script
    with pytest.raises(ValueError):
        render_policy(key_name='k"; os.execute("x") --', zone="z.", names=("a.z.",))
