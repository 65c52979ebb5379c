"""Steering two authoritative servers that share one key: each is read, updated only if needed, and verified."""

from __future__ import annotations

from collections.abc import Iterator

import dns.tsig
import pytest
from temporalio.exceptions import ApplicationError

from activities.contracts.dns import SteerGetInput
from activities.dns.actions import steer_get, steer_set
from activities.dns.steering import encode_lua_rdata, steering_code
from lab.dns import PdnsLab, PdnsSettings, free_dns_port, prepare, start, stop
from tests.dns.support import FQDN, GAME_IP, MAINT_IP, FakeVault, raw_update, set_input


@pytest.fixture(scope="module")
def second(pdns_lab: PdnsLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdnsLab]:
    settings = PdnsSettings(port=free_dns_port(), game_ip=GAME_IP, maint_ip=MAINT_IP, start_percent=0)
    lab = prepare(tmp_path_factory.mktemp("pdns2"), settings, key=pdns_lab.key)
    proc = start(lab)
    try:
        yield lab
    finally:
        stop(proc)


async def test_two_servers_converge(pdns_lab: PdnsLab, second: PdnsLab, vault: FakeVault) -> None:
    servers = [pdns_lab.settings.address, second.settings.address]
    await steer_set(set_input(pdns_lab, 0, servers=servers))
    out = await steer_set(set_input(pdns_lab, 30, servers=servers))
    assert out.changed and out.updated_servers == servers and out.verified_servers == servers

    # Drift on one server only: the next set touches just that one.
    key = dns.tsig.Key(second.key.name, second.key.secret, dns.tsig.HMAC_SHA256)
    await raw_update(second, FQDN, encode_lua_rdata("A", steering_code(GAME_IP, MAINT_IP, 60)), key)
    got = await steer_get(SteerGetInput(zone=pdns_lab.settings.zone, name="play", servers=servers))
    assert not got.consistent and [s.percent for s in got.servers] == [30, 60]

    out = await steer_set(set_input(pdns_lab, 30, servers=servers))
    assert out.updated_servers == [second.settings.address]
    assert [s.percent for s in out.previous] == [30, 60] and out.previous_percent == 30
    assert out.undo.percent == 30  # rollback goes to the lowest previous share
    got = await steer_get(SteerGetInput(zone=pdns_lab.settings.zone, name="play", servers=servers))
    assert got.consistent and got.percent == 30


async def test_dead_server_is_retryable(pdns_lab: PdnsLab, vault: FakeVault) -> None:
    dead = f"127.0.0.1:{free_dns_port()}"
    with pytest.raises(ApplicationError) as err:
        await steer_set(set_input(pdns_lab, 30, servers=[pdns_lab.settings.address, dead], timeout_s=0.5))
    assert not err.value.non_retryable and dead in str(err.value)
