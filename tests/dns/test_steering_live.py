"""Steering against a real pdns_server: read-back, admitted share, stickiness and every refusal path."""

from __future__ import annotations

import base64
import secrets

import dns.asyncquery
import dns.message
import dns.rcode
import dns.tsig
import dns.update
import pytest
from temporalio.exceptions import ApplicationError

from activities.contracts.dns import SteerGetInput, SteerSampleInput, ecs_subnets, parse_server
from activities.dns.actions import steer_get, steer_sample, steer_set
from activities.dns.axfr import read_state
from activities.dns.ecs import query_clients
from activities.dns.steering import encode_lua_rdata, steering_code
from lab.dns import PdnsLab
from tests.dns.support import FQDN, GAME_IP, MAINT_IP, FakeVault, raw_update, set_input


async def _percent(lab: PdnsLab) -> float | None:
    return (await read_state(lab.settings.address, lab.settings.zone, FQDN)).percent


def _good_key(lab: PdnsLab) -> dns.tsig.Key:
    return dns.tsig.Key(lab.key.name, lab.key.secret, dns.tsig.HMAC_SHA256)


async def test_set_reads_back_and_is_idempotent(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    await steer_set(set_input(pdns_lab, 0))
    previous = 0
    for percent in (10, 30, 100, 0, 50):
        out = await steer_set(set_input(pdns_lab, percent))
        assert (out.previous_percent, out.percent, out.changed) == (previous, percent, True)
        assert out.verified_servers == [pdns_lab.settings.address]
        assert out.undo.percent == previous and out.undo.servers == out.verified_servers
        got = await steer_get(
            SteerGetInput(zone=pdns_lab.settings.zone, name="play", servers=[pdns_lab.settings.address])
        )
        assert got.consistent and got.percent == percent and got.servers[0].game_ip == GAME_IP
        previous = percent

    vault.calls.clear()
    again = await steer_set(set_input(pdns_lab, 50))
    assert not again.changed and again.updated_servers == []
    # A no-op needs no secret, so a retry while Vault is down still succeeds.
    assert vault.calls == []
    await steer_set(set_input(pdns_lab, 60))
    assert vault.calls[0] == {"url": "http://vault.lab:8200", "token": "test-token"}
    assert vault.calls[1]["path"] == "coldstart/dns-tsig"


@pytest.mark.parametrize("percent", [10, 30, 50, 90])
async def test_sampled_share_matches_target(pdns_lab: PdnsLab, vault: FakeVault, percent: int) -> None:
    await steer_set(set_input(pdns_lab, percent))
    out = await steer_sample(
        SteerSampleInput(server=pdns_lab.settings.address, name=FQDN, game_ip=GAME_IP, clients=2000)
    )
    assert out.unanswered == 0 and out.admitted + out.other == 2000
    assert abs(out.admitted_fraction * 100 - percent) <= 1.5, out


async def test_admitted_clients_stay_admitted(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    subnets = ecs_subnets("10.0.0.0/8", 24, 2000)
    admitted: list[set[int]] = []
    for percent in (30, 40):
        await steer_set(set_input(pdns_lab, percent))
        answers = await query_clients(pdns_lab.settings.address, FQDN, subnets)
        assert None not in answers and set(answers) <= {GAME_IP, MAINT_IP}
        admitted.append({i for i, a in enumerate(answers) if a == GAME_IP})
    at30, at40 = admitted
    assert at30 <= at40 and len(at40) > len(at30)


async def test_unsigned_update_is_refused(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    await steer_set(set_input(pdns_lab, 20))
    rdata = encode_lua_rdata("A", steering_code(GAME_IP, MAINT_IP, 100))
    # pdns answers NOERROR to a policy refusal, so only the read-back shows it was refused.
    await raw_update(pdns_lab, FQDN, rdata, key=None)
    assert await _percent(pdns_lab) == 20


async def test_wrong_key_fails_clearly_and_changes_nothing(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    await steer_set(set_input(pdns_lab, 20))
    vault.secret = base64.b64encode(secrets.token_bytes(32)).decode()
    with pytest.raises(ApplicationError) as err:
        await steer_set(set_input(pdns_lab, 70))
    assert err.value.non_retryable
    assert f"update refused by {pdns_lab.settings.address}: record still at 20%" in str(err.value)
    assert vault.secret not in str(err.value)
    assert await _percent(pdns_lab) == 20


async def test_unknown_key_name_is_refused(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    await steer_set(set_input(pdns_lab, 20))
    with pytest.raises(ApplicationError) as err:
        await steer_set(set_input(pdns_lab, 70, tsig_key_name="someone-else."))
    assert err.value.non_retryable and "record still at 20%" in str(err.value)
    assert await _percent(pdns_lab) == 20


async def test_policy_refuses_other_names_and_types(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    rdata = encode_lua_rdata("A", "os.execute('touch /tmp/pwned') or '192.0.2.1'")
    assert await raw_update(pdns_lab, "evil.play.coldstart.lab.", rdata, _good_key(pdns_lab)) == dns.rcode.NOERROR
    evil = await read_state(pdns_lab.settings.address, pdns_lab.settings.zone, "evil.play.coldstart.lab.")
    assert not evil.present

    host, port = parse_server(pdns_lab.settings.address)
    upd = dns.update.UpdateMessage(pdns_lab.settings.zone, keyring=_good_key(pdns_lab))
    upd.add(FQDN, 30, "TXT", "not a steering type")
    upd.add("ns1.play.coldstart.lab.", 30, "A", "192.0.2.66")
    await dns.asyncquery.tcp(upd, host, port=port, timeout=3)
    txt = await dns.asyncquery.udp(dns.message.make_query(FQDN, "TXT"), host, port=port, timeout=3)
    assert not txt.answer
    ns = await dns.asyncquery.udp(dns.message.make_query("ns1.play.coldstart.lab.", "A"), host, port=port, timeout=3)
    assert [rd.address for rd in ns.answer[0]] == ["127.0.0.1"]


async def test_foreign_lua_is_not_overwritten(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    foreign = encode_lua_rdata("A", "'192.0.2.7'")
    await raw_update(pdns_lab, FQDN, foreign, _good_key(pdns_lab))
    try:
        with pytest.raises(ApplicationError) as err:
            await steer_set(set_input(pdns_lab, 40))
        assert err.value.non_retryable and "not a steering record" in str(err.value)
    finally:
        restore = encode_lua_rdata("A", steering_code(GAME_IP, MAINT_IP, 0))
        await raw_update(pdns_lab, FQDN, restore, _good_key(pdns_lab))
    assert await _percent(pdns_lab) == 0
