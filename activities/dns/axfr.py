"""Read a server's steering record by AXFR: the stored Lua, which a query would execute instead."""

from __future__ import annotations

import asyncio
from typing import Any

import dns.exception
import dns.name
import dns.query
import dns.rdatatype
import dns.xfr
from temporalio.exceptions import ApplicationError

from activities.contracts.dns import ServerState, parse_server
from activities.dns.steering import LUA_RDTYPE, decode_lua_rdata, parse_steering_code

__all__ = ["read_state"]


def _state_from_rrsets(server: str, serial: int | None, rdatas: list[Any], ttl: int | None) -> ServerState:
    state = ServerState(server=server, serial=serial, present=bool(rdatas), ttl=ttl)
    if not rdatas:
        return state
    if len(rdatas) > 1:
        state.foreign_code = f"{len(rdatas)} LUA records at one name"
        return state
    inner, code = decode_lua_rdata(rdatas[0])
    steering = parse_steering_code(code) if inner == "A" else None
    if steering is None:
        state.foreign_code = f"LUA {inner} {code[:120]}"
        return state
    state.percent, state.game_ip, state.maint_ip = steering.percent, steering.game_ip, steering.maint_ip
    return state


def _read_state_sync(server: str, zone: str, fqdn: str, timeout: float) -> ServerState:
    host, port = parse_server(server)
    zone_name, owner = dns.name.from_text(zone), dns.name.from_text(fqdn)
    serial: int | None = None
    rdatas: list[Any] = []
    ttl: int | None = None
    # AXFR rather than a query: a LUA record is executed on query, and only a transfer
    # shows the stored code. The controller must be in the server's allow-axfr-ips.
    for msg in dns.query.xfr(host, zone_name, port=port, timeout=timeout, lifetime=timeout * 5, relativize=False):
        for rrset in msg.answer:
            if rrset.rdtype == dns.rdatatype.SOA and rrset.name == zone_name:
                serial = rrset[0].serial
            elif rrset.rdtype == LUA_RDTYPE and rrset.name == owner:
                rdatas.extend(rrset)
                ttl = rrset.ttl
    return _state_from_rrsets(server, serial, rdatas, ttl)


async def read_state(server: str, zone: str, fqdn: str, timeout: float = 3.0) -> ServerState:
    """AXFR the zone from `server` and return its steering record's state."""
    try:
        return await asyncio.to_thread(_read_state_sync, server, zone, fqdn, timeout)
    except (dns.xfr.TransferError, dns.query.TransferError) as exc:
        # REFUSED/NOTAUTH is configuration (allow-axfr-ips), not a blip; retrying won't fix it.
        raise ApplicationError(
            f"AXFR of {zone} refused by {server} ({exc}); is this worker in its allow-axfr-ips?",
            type="AxfrRefused",
            non_retryable=True,
        ) from None
    except (OSError, EOFError, dns.exception.DNSException) as exc:
        raise ApplicationError(
            f"cannot read {zone} from {server}: {type(exc).__name__}: {exc}", type="DnsUnreachable"
        ) from None
