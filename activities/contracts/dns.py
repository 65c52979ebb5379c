"""Contracts of the DNS steering actions: admit a hashed share of players to the game IP, the rest to the maintenance IP."""

from __future__ import annotations

import ipaddress
from datetime import timedelta

import dns.exception
import dns.name
from pydantic import Field, field_validator, model_validator

from activities._fields import AbsoluteName, IPv4
from activities.contracts.model import ContractModel
from activities.contracts.targets import VaultSecretRef
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "STEER_GET",
    "STEER_SAMPLE",
    "STEER_SET",
    "ServerState",
    "SteerGetInput",
    "SteerGetOutput",
    "SteerSampleInput",
    "SteerSampleOutput",
    "SteerSetInput",
    "SteerSetOutput",
    "SteeredName",
    "ecs_subnets",
    "parse_server",
]


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


class ServerState(ContractModel):
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


class SteeredName(ContractModel):
    """Zone, steering name and the authoritative servers that serve it."""

    zone: AbsoluteName = Field(description="zone holding the steering record, e.g. play.coldstart.lab.")
    name: str = Field(description="steering name, relative to the zone (play) or absolute")
    servers: list[str] = Field(min_length=1, description="authoritative servers as ip:port; each is verified")
    timeout_s: float = Field(default=3.0, gt=0, le=30, description="per DNS exchange")

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: list[str]) -> list[str]:
        for s in v:
            parse_server(s)
        if len(set(v)) != len(v):
            raise ValueError("servers listed twice")
        return v

    @model_validator(mode="after")
    def _name_in_zone(self) -> SteeredName:
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


class SteerSetInput(SteeredName):
    """Set the steering record to `percent` on every server and verify it took."""

    game_ip: IPv4 = Field(description="IPv4 answered to admitted clients")
    maint_ip: IPv4 = Field(description="IPv4 answered to everyone else")
    percent: int = Field(ge=0, le=100, description="share of clients admitted to game_ip")
    ttl: int = Field(default=30, ge=1, le=86400, description="TTL of the answers")
    tsig_key_name: AbsoluteName = Field(description="TSIG key name (hmac-sha256)")
    tsig_secret: VaultSecretRef = Field(description="where the TSIG secret lives; read inside the activity")

    @model_validator(mode="after")
    def _distinct(self) -> SteerSetInput:
        if self.game_ip == self.maint_ip:
            raise ValueError("game_ip and maint_ip must differ")
        return self


class SteerSetOutput(ContractModel):
    previous_percent: float | None = Field(description="first server's percent before; None if absent")
    percent: int
    changed: bool
    verified_servers: list[str]
    updated_servers: list[str]
    previous: list[ServerState]
    undo: SteerSetInput = Field(
        description="this input at the lowest previous percent (0 if absent): rolling back admits no one new"
    )


class SteerGetInput(SteeredName):
    """Read the steering record on every server."""


class SteerGetOutput(ContractModel):
    servers: list[ServerState]
    # The common percent when every server agrees on the whole record, else None.
    percent: float | None
    consistent: bool


class SteerSampleInput(ContractModel):
    """Ask one server as N distinct ECS client subnets and measure the admitted share."""

    server: str
    name: AbsoluteName = Field(description="absolute steering name, e.g. play.play.coldstart.lab.")
    game_ip: IPv4
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

    @model_validator(mode="after")
    def _room(self) -> SteerSampleInput:
        ecs_subnets(self.ecs_base, self.ecs_prefix, self.clients)
        return self


class SteerSampleOutput(ContractModel):
    clients: int
    admitted: int
    other: int = Field(description="answered, but not game_ip")
    unanswered: int
    admitted_fraction: float = Field(description="admitted / clients")


STEER_SET = declare(
    "dns.steer.set", SteerSetInput, SteerSetOutput, timeout=60, mutating=True, undo="dns.steer.set", undo_from_output="undo", retry=Retry(
        max_attempts=5, initial_interval=timedelta(seconds=1), max_interval=timedelta(seconds=10)
    ),
    doc="""Steer `percent` of players to the game IP on every authoritative server, and verify it took.""",
)


STEER_GET = declare(
    "dns.steer.get", SteerGetInput, SteerGetOutput, timeout=30, heartbeat=10, retry=Retry(max_attempts=5),
    doc="""Read the steering record (percent, IPs, serial) from every authoritative server by AXFR.""",
)


STEER_SAMPLE = declare(
    "dns.steer.sample", SteerSampleInput, SteerSampleOutput, timeout=120, retry=Retry(max_attempts=3),
    doc="""Measure the admitted share on one server by querying as N distinct ECS client subnets.""",
)
