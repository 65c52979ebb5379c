"""DNS steering actions: admit a hashed share of players to the game IP, the rest to the maintenance IP."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import math
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import dns.asyncquery
import dns.edns
import dns.exception
import dns.message
import dns.name
import dns.query
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.tsig
import dns.update
import dns.xfr
from pydantic import BaseModel, Field, field_validator, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.registry import RetryDefaults, action
from activities.secrets import VaultSecretRef, read_kv_secret

__all__ = [
    "LUA_RDTYPE",
    "SCALE",
    "ServerState",
    "SteerGetInput",
    "SteerGetOutput",
    "SteerSampleInput",
    "SteerSampleOutput",
    "SteerSetInput",
    "SteerSetOutput",
    "Steering",
    "decode_lua_rdata",
    "ecs_subnets",
    "encode_lua_rdata",
    "parse_server",
    "parse_steering_code",
    "query_clients",
    "read_state",
    "steer_get",
    "steer_sample",
    "steer_set",
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


# --- the steering record ----------------------------------------------------------------------


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
    inner = dns.rdatatype.to_text(int.from_bytes(wire[:2], "big"))
    parts, i = [], 2
    while i < len(wire):
        n = wire[i]
        parts.append(wire[i + 1 : i + 1 + n])
        i += 1 + n
    return inner, b"".join(parts).decode("ascii", errors="replace")



def parse_server(server: str) -> tuple[str, int]:
    """'192.0.2.1:53' or '[2001:db8::1]:53' -> (ip, port); a bare IP means port 53."""
    text = server.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if port_text is None:
        raise ValueError(f"bad server {server!r}: expected ip:port")
    ipaddress.ip_address(host)
    port = int(port_text) if port_text else 53
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {server!r}")
    return host, port


def _absolute(text: str) -> str:
    # dnspython's name errors are not ValueErrors; pydantic only turns ValueErrors into messages.
    try:
        return dns.name.from_text(text).to_text()
    except dns.exception.DNSException as exc:
        raise ValueError(f"bad DNS name {text!r}: {exc}") from None


def _ipv4(text: str) -> str:
    return str(ipaddress.IPv4Address(text.strip()))


class _Target(BaseModel):
    """Zone, steering name and the authoritative servers that serve it."""

    zone: str = Field(description="zone holding the steering record, e.g. play.coldstart.lab.")
    name: str = Field(description="steering name, relative to the zone (play) or absolute")
    servers: list[str] = Field(min_length=1, description="authoritative servers as ip:port; each is verified")
    timeout_s: float = Field(default=3.0, gt=0, le=30, description="per DNS exchange")

    @field_validator("zone")
    @classmethod
    def _zone(cls, v: str) -> str:
        return _absolute(v)

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: list[str]) -> list[str]:
        for s in v:
            parse_server(s)
        if len(set(v)) != len(v):
            raise ValueError("servers listed twice")
        return v

    @model_validator(mode="after")
    def _name_in_zone(self) -> "_Target":
        try:
            fqdn = self.fqdn
        except dns.exception.DNSException as exc:
            raise ValueError(f"bad DNS name {self.name!r}: {exc}") from None
        if not dns.name.from_text(fqdn).is_subdomain(dns.name.from_text(self.zone)):
            raise ValueError(f"{fqdn} is not in zone {self.zone}")
        return self

    @property
    def fqdn(self) -> str:
        origin = dns.name.from_text(self.zone)
        return dns.name.from_text(self.name, origin=origin).to_text()


class SteerSetInput(_Target):
    """Set the steering record to `percent` on every server and verify it took."""

    game_ip: str = Field(description="IPv4 answered to admitted clients")
    maint_ip: str = Field(description="IPv4 answered to everyone else")
    percent: int = Field(ge=0, le=100, description="share of clients admitted to game_ip")
    ttl: int = Field(default=30, ge=1, le=86400, description="TTL of the answers")
    tsig_key_name: str = Field(description="TSIG key name (hmac-sha256)")
    tsig_secret: VaultSecretRef = Field(description="where the TSIG secret lives; read inside the activity")

    @field_validator("game_ip", "maint_ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        return _ipv4(v)

    @field_validator("tsig_key_name")
    @classmethod
    def _key(cls, v: str) -> str:
        return _absolute(v)

    @model_validator(mode="after")
    def _distinct(self) -> "SteerSetInput":
        if self.game_ip == self.maint_ip:
            raise ValueError("game_ip and maint_ip must differ")
        return self


class ServerState(BaseModel):
    """What one server's zone holds for the steering name, read by AXFR."""

    server: str
    serial: int | None = None
    present: bool = False
    percent: float | None = None
    game_ip: str | None = None
    maint_ip: str | None = None
    ttl: int | None = None
    # Set when the name holds Lua we did not write; we report it and refuse to overwrite it.
    foreign_code: str | None = None


class SteerSetOutput(BaseModel):
    previous_percent: float | None = Field(description="first server's percent before; None if absent")
    percent: int
    changed: bool
    verified_servers: list[str]
    updated_servers: list[str]
    previous: list[ServerState]
    undo: SteerSetInput = Field(
        description="this input at the lowest previous percent (0 if absent): rolling back admits no one new"
    )


class SteerGetInput(_Target):
    """Read the steering record on every server."""


class SteerGetOutput(BaseModel):
    servers: list[ServerState]
    # The common percent when every server agrees on the whole record, else None.
    percent: float | None
    consistent: bool


class SteerSampleInput(BaseModel):
    """Ask one server as N distinct ECS client subnets and measure the admitted share."""

    server: str
    name: str = Field(description="absolute steering name, e.g. play.play.coldstart.lab.")
    game_ip: str
    clients: int = Field(default=1000, ge=1, le=65536)
    ecs_base: str = Field(default="10.0.0.0/8", description="IPv4 network the client subnets are cut from")
    ecs_prefix: int = Field(default=24, ge=8, le=32, description="source prefix length of each client subnet")
    concurrency: int = Field(default=64, ge=1, le=1024)
    timeout_s: float = Field(default=1.0, gt=0, le=10)
    attempts: int = Field(default=3, ge=1, le=10)

    @field_validator("server")
    @classmethod
    def _server(cls, v: str) -> str:
        parse_server(v)
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _absolute(v)

    @field_validator("game_ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        return _ipv4(v)

    @model_validator(mode="after")
    def _room(self) -> "SteerSampleInput":
        ecs_subnets(self.ecs_base, self.ecs_prefix, self.clients)
        return self


class SteerSampleOutput(BaseModel):
    clients: int
    admitted: int
    other: int = Field(description="answered, but not game_ip")
    unanswered: int
    admitted_fraction: float = Field(description="admitted / clients")


# --- reading and writing the zone -----------------------------------------------------------------


def _fmt(percent: float | None) -> str:
    if percent is None:
        return "absent"
    return f"{percent:g}%"


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


async def _send_update(inp: SteerSetInput, server: str, key: dns.tsig.Key) -> str | None:
    """Send the UPDATE; return None on NOERROR, else what went wrong (never the secret)."""
    host, port = parse_server(server)
    upd = steering_update(
        inp.zone, inp.fqdn, game_ip=inp.game_ip, maint_ip=inp.maint_ip, percent=inp.percent, ttl=inp.ttl, key=key
    )
    try:
        reply = await dns.asyncquery.tcp(upd, host, port=port, timeout=inp.timeout_s)
    except dns.exception.Timeout:
        raise
    except dns.exception.DNSException as exc:
        # pdns answers a bad signature or an unknown key with an unsigned error, which
        # dnspython rejects ("response requires a TSIG"): a refusal, not a transport problem.
        return f"reply rejected, likely a TSIG key/secret mismatch: {exc}"
    if reply.rcode() != dns.rcode.NOERROR:
        return f"rcode {dns.rcode.to_text(reply.rcode())}"
    return None


def _why(state: ServerState, problems: dict[str, str | None]) -> str:
    if state.server not in problems:
        # It was at target when read, so something else wrote it meanwhile.
        return f"{state.server} changed by someone else during this update: now at {_fmt(state.percent)}"
    problem = problems[state.server] or "NOERROR reply, but not applied: the server's update policy rejected it"
    return f"update refused by {state.server}: record still at {_fmt(state.percent)} ({problem})"


def _undo_input(inp: SteerSetInput, before: list[ServerState]) -> SteerSetInput:
    # Servers may have disagreed; going back to the lowest share never admits anyone who
    # was not admitted somewhere before.
    percents = [s.percent if s.percent is not None else 0.0 for s in before]
    return inp.model_copy(update={"percent": int(math.floor(min(percents)))})


def _at_target(state: ServerState, inp: SteerSetInput) -> bool:
    return (
        state.foreign_code is None
        and state.percent == inp.percent
        and state.game_ip == inp.game_ip
        and state.maint_ip == inp.maint_ip
        and state.ttl == inp.ttl
    )


async def _tsig_key(inp: SteerSetInput) -> dns.tsig.Key:
    # hvac is blocking; keep it off the event loop that other activities share.
    secret = await asyncio.to_thread(read_kv_secret, inp.tsig_secret)
    try:
        return dns.tsig.Key(inp.tsig_key_name, secret, dns.tsig.HMAC_SHA256)
    except Exception:
        raise ApplicationError(
            "the TSIG secret in Vault is not valid base64", type="VaultMissing", non_retryable=True
        ) from None


# --- actions --------------------------------------------------------------------------------------


@action(
    "dns.steer.set",
    timeout=60,
    mutating=True,
    undo="dns.steer.set",
    undo_from_output="undo",
    retry=RetryDefaults(
        max_attempts=5, initial_interval=timedelta(seconds=1), max_interval=timedelta(seconds=10)
    ),
)
async def steer_set(inp: SteerSetInput) -> SteerSetOutput:
    """Steer `percent` of players to the game IP on every authoritative server, and verify it took."""
    log = activity.logger
    before = list(await asyncio.gather(*(read_state(s, inp.zone, inp.fqdn, inp.timeout_s) for s in inp.servers)))
    for state in before:
        if state.foreign_code is not None:
            raise ApplicationError(
                f"{inp.fqdn} on {state.server} is not a steering record ({state.foreign_code});"
                " refusing to overwrite",
                type="NotSteering",
                non_retryable=True,
            )
    pending = [s.server for s in before if not _at_target(s, inp)]
    if not pending:
        log.info("dns.steer.set: %s already at %s%% on all servers", inp.fqdn, inp.percent)
        return SteerSetOutput(
            previous_percent=before[0].percent,
            percent=inp.percent,
            changed=False,
            verified_servers=list(inp.servers),
            updated_servers=[],
            previous=before,
            undo=_undo_input(inp, before),
        )

    # Only now fetch the key: a no-op retry needs neither Vault nor the secret.
    key = await _tsig_key(inp)
    problems: dict[str, str | None] = {}
    for server in pending:
        # One server at a time: if several front one backend, later ones are then already at target.
        try:
            problems[server] = await _send_update(inp, server, key)
        except (OSError, EOFError, dns.exception.Timeout) as exc:
            problems[server] = f"no reply: {type(exc).__name__}"
        log.info("dns.steer.set: UPDATE %s on %s -> %s", inp.fqdn, server, problems[server] or "NOERROR")

    after = list(await asyncio.gather(*(read_state(s, inp.zone, inp.fqdn, inp.timeout_s) for s in inp.servers)))
    failed = [s for s in after if not _at_target(s, inp)]
    if failed:
        unreachable_only = all((problems.get(s.server) or "").startswith("no reply") for s in failed)
        details = "; ".join(_why(s, problems) for s in failed)
        done = [s.server for s in after if _at_target(s, inp)]
        raise ApplicationError(
            f"{inp.fqdn} not at {inp.percent}%: {details}"
            + (f"; at target: {', '.join(done)}" if done else ""),
            type="UpdateNotApplied",
            # A lost reply may be a server restarting: retry. A refusal (key, policy) won't heal.
            non_retryable=not unreachable_only,
        )
    return SteerSetOutput(
        previous_percent=before[0].percent,
        percent=inp.percent,
        changed=True,
        verified_servers=[s.server for s in after],
        updated_servers=pending,
        previous=before,
        undo=_undo_input(inp, before),
    )


@action("dns.steer.get", timeout=30, retry=RetryDefaults(max_attempts=5))
async def steer_get(inp: SteerGetInput) -> SteerGetOutput:
    """Read the steering record (percent, IPs, serial) from every authoritative server by AXFR."""
    states = list(await asyncio.gather(*(read_state(s, inp.zone, inp.fqdn, inp.timeout_s) for s in inp.servers)))
    signatures = {(s.present, s.percent, s.game_ip, s.maint_ip, s.ttl, s.foreign_code) for s in states}
    consistent = len(signatures) == 1
    return SteerGetOutput(servers=states, percent=states[0].percent if consistent else None, consistent=consistent)


def ecs_subnets(base: str, prefix: int, count: int) -> list[ipaddress.IPv4Network]:
    """`count` consecutive /prefix subnets cut from `base`: one per simulated client."""
    net = ipaddress.IPv4Network(base, strict=False)
    if prefix < net.prefixlen:
        raise ValueError(f"ecs_prefix /{prefix} is wider than {net}")
    room = 1 << (prefix - net.prefixlen)
    if count > room:
        raise ValueError(f"{net} holds only {room} /{prefix} subnets, {count} asked")
    step = 1 << (32 - prefix)
    first = int(net.network_address)
    return [ipaddress.IPv4Network((first + i * step, prefix)) for i in range(count)]


class _Replies(asyncio.DatagramProtocol):
    """Matches replies on one shared UDP socket to waiting queries by ID and echoed ECS subnet."""

    def __init__(self) -> None:
        self.waiting: dict[int, tuple[asyncio.Future[dns.message.Message], str]] = {}

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            msg = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return
        entry = self.waiting.get(msg.id)
        if entry is None:
            return
        future, subnet = entry
        # A late reply to an earlier use of this ID carries another subnet: ignore it.
        if _ecs_of(msg) == subnet and not future.done():
            future.set_result(msg)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors carry no query ID; the per-query timeout handles the loss.
        pass


def _ecs_of(msg: dns.message.Message) -> str | None:
    for opt in msg.options:
        if isinstance(opt, dns.edns.ECSOption):
            return f"{opt.address}/{opt.srclen}"
    return None


async def query_clients(
    server: str,
    fqdn: str,
    subnets: list[ipaddress.IPv4Network],
    *,
    concurrency: int = 64,
    timeout: float = 1.0,
    attempts: int = 3,
) -> list[str | None]:
    """Ask for `fqdn` A once per client subnet (as ECS); returns each client's first address or None.

    One UDP socket for all queries keeps 10k queries cheap; the semaphore bounds how
    many are in flight so the server's receive buffer is never the thing being measured.
    """
    host, port = parse_server(server)
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(_Replies, remote_addr=(host, port))
    ids = itertools.count()
    gate = asyncio.Semaphore(concurrency)

    def next_id() -> int:
        while True:
            qid = next(ids) & 0xFFFF
            if qid not in proto.waiting:
                return qid

    async def ask(subnet: ipaddress.IPv4Network) -> str | None:
        key = f"{subnet.network_address}/{subnet.prefixlen}"
        async with gate:
            for _ in range(attempts):
                qid = next_id()
                query = dns.message.make_query(
                    fqdn, dns.rdatatype.A, use_edns=0,
                    options=[dns.edns.ECSOption(str(subnet.network_address), subnet.prefixlen)],
                )
                query.id = qid
                future: asyncio.Future[dns.message.Message] = loop.create_future()
                proto.waiting[qid] = (future, key)
                try:
                    transport.sendto(query.to_wire())
                    reply = await asyncio.wait_for(future, timeout)
                except asyncio.TimeoutError:
                    continue
                finally:
                    proto.waiting.pop(qid, None)
                for rrset in reply.answer:
                    if rrset.rdtype == dns.rdatatype.A:
                        return rrset[0].address
                return None
            return None

    try:
        return list(await asyncio.gather(*(ask(s) for s in subnets)))
    finally:
        transport.close()


@action("dns.steer.sample", timeout=120, retry=RetryDefaults(max_attempts=3))
async def steer_sample(inp: SteerSampleInput) -> SteerSampleOutput:
    """Measure the admitted share on one server by querying as N distinct ECS client subnets."""
    subnets = ecs_subnets(inp.ecs_base, inp.ecs_prefix, inp.clients)
    answers = await query_clients(
        inp.server, inp.name, subnets, concurrency=inp.concurrency, timeout=inp.timeout_s, attempts=inp.attempts
    )
    admitted = sum(1 for a in answers if a == inp.game_ip)
    unanswered = sum(1 for a in answers if a is None)
    return SteerSampleOutput(
        clients=inp.clients,
        admitted=admitted,
        other=inp.clients - admitted - unanswered,
        unanswered=unanswered,
        admitted_fraction=admitted / inp.clients,
    )
