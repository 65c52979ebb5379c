"""The steering record's codec: its pickwhashed Lua, LUA rdata, the UPDATE that writes it, server addresses."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.tsig
import dns.update

__all__ = [
    "LUA_RDTYPE",
    "SCALE",
    "Steering",
    "decode_lua_rdata",
    "encode_lua_rdata",
    "parse_steering_code",
    "steering_code",
    "steering_update",
]

# PowerDNS's private LUA record type; dnspython has no class for it, so it travels as generic rdata.
LUA_RDTYPE = dns.rdatatype.RdataType.make(65402)
# pickwhashed weights: 10000 lets a percent carry two decimals should finer steps ever be wanted.
SCALE = 10000

_CODE_RE = re.compile(
    r"^pickwhashed\(\{\{(\d+),'([0-9.]+)'\},\{(\d+),'([0-9.]+)'\}\}\)$"
)


@dataclass(frozen=True)
class Steering:
    """One steering record: `weight` of SCALE hashed clients get game_ip, the rest maint_ip."""

    game_ip: str
    maint_ip: str
    weight: int

    @property
    def percent(self) -> float:
        return self.weight * 100 / SCALE

    @property
    def code(self) -> str:
        return steering_code(self.game_ip, self.maint_ip, self.weight * 100 / SCALE)


def steering_code(game_ip: str, maint_ip: str, percent: float) -> str:
    """The Lua of the steering record.

    pickwhashed hashes the client address (its ECS subnet when present) into [0, SCALE)
    and answers game_ip below the game weight, so raising the weight only adds clients
    and a client keeps its answer. game_ip must come first for that to hold. Single
    quotes because the record's presentation form wraps the code in double quotes.
    """
    ipaddress.IPv4Address(game_ip)
    ipaddress.IPv4Address(maint_ip)
    weight = round(percent * SCALE / 100)
    if not 0 <= weight <= SCALE:
        raise ValueError(f"percent out of range: {percent}")
    return f"pickwhashed({{{{{weight},'{game_ip}'}},{{{SCALE - weight},'{maint_ip}'}}}})"


def parse_steering_code(code: str) -> Steering | None:
    """Inverse of steering_code; None for any other Lua (which we then refuse to overwrite)."""
    m = _CODE_RE.match(code.strip())
    if not m:
        return None
    w_game, game_ip, w_maint, maint_ip = int(m[1]), m[2], int(m[3]), m[4]
    if w_game + w_maint != SCALE:
        return None
    try:
        ipaddress.IPv4Address(game_ip)
        ipaddress.IPv4Address(maint_ip)
    except ValueError:
        return None
    return Steering(game_ip=game_ip, maint_ip=maint_ip, weight=w_game)


def encode_lua_rdata(inner_type: str, code: str) -> dns.rdata.GenericRdata:
    """LUA rdata on the wire: the 16-bit inner type, then the code as 255-byte character-strings."""
    raw = code.encode("ascii")
    chunks = [raw[i : i + 255] for i in range(0, len(raw), 255)] or [b""]
    wire = int(dns.rdatatype.from_text(inner_type)).to_bytes(2, "big")
    wire += b"".join(bytes([len(c)]) + c for c in chunks)
    return dns.rdata.GenericRdata(dns.rdataclass.IN, LUA_RDTYPE, wire)


def decode_lua_rdata(rdata: Any) -> tuple[str, str]:
    """(inner type, code) from a LUA rdata as dnspython parses it (generic)."""
    wire: bytes = rdata.data
    if len(wire) < 3:
        raise ValueError("LUA rdata too short")
    inner = dns.rdatatype.to_text(dns.rdatatype.RdataType.make(int.from_bytes(wire[:2], "big")))
    parts, i = [], 2
    while i < len(wire):
        n = wire[i]
        parts.append(wire[i + 1 : i + 1 + n])
        i += 1 + n
    return inner, b"".join(parts).decode("ascii", errors="replace")


def steering_update(
    zone: str, fqdn: str, *, game_ip: str, maint_ip: str, percent: float, ttl: int, key: dns.tsig.Key | None
) -> dns.update.UpdateMessage:
    """The signed UPDATE that replaces the steering record at `fqdn`."""
    upd = dns.update.UpdateMessage(
        zone, keyring=key, keyname=key.name if key else None, keyalgorithm=dns.tsig.HMAC_SHA256
    )
    # Delete-rrset then add in one message: pdns applies it as one transaction.
    upd.delete(fqdn, LUA_RDTYPE)
    upd.add(fqdn, ttl, encode_lua_rdata("A", steering_code(game_ip, maint_ip, percent)))
    return upd
