"""What a lab PowerDNS instance serves and where its files live."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PdnsPaths", "PdnsSettings"]


@dataclass(frozen=True)
class PdnsSettings:
    """Everything that shapes one lab authoritative server; defaults suit a loopback test."""

    zone: str = "play.coldstart.lab."
    # Names (relative to the zone, "@" for the apex) that carry a steering record and that
    # the UPDATE policy lets the steering key touch; nothing else in the zone is writable.
    steering_names: tuple[str, ...] = ("play",)
    game_ip: str = "10.20.0.10"
    maint_ip: str = "10.20.0.99"
    start_percent: int = 0
    record_ttl: int = 30
    bind_address: str = "127.0.0.1"
    port: int = 5353
    # Who may AXFR without TSIG: the controller reads every change back this way.
    axfr_from: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    key_name: str = "coldstart-steer."
    nameserver: str = "ns1"
    pdns_server: str = "/usr/sbin/pdns_server"
    # Packet/query caches are kept at pdns defaults on purpose: UPDATE purges them, and the
    # benchmark should measure that path rather than a cache-less server.
    cache_ttl: int = 20
    query_cache_ttl: int = 20
    receiver_threads: int = 1
    distributor_threads: int = 3
    loglevel: int = 4
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.zone.endswith("."):
            raise ValueError(f"zone must be absolute (end in '.'): {self.zone!r}")
        if not self.key_name.endswith("."):
            raise ValueError(f"key_name must be absolute (end in '.'): {self.key_name!r}")
        ipaddress.ip_address(self.bind_address)
        ipaddress.IPv4Address(self.game_ip)
        ipaddress.IPv4Address(self.maint_ip)
        for net in self.axfr_from:
            ipaddress.ip_network(net, strict=False)
        if not 0 <= self.start_percent <= 100:
            raise ValueError("start_percent must be 0..100")
        if not 0 < self.port < 65536:
            raise ValueError("port must be 1..65535")
        if not self.steering_names:
            raise ValueError("at least one steering name is needed")

    def absolute(self, name: str) -> str:
        """`play` -> `play.play.coldstart.lab.`; `@` -> the zone; absolute names pass through."""
        if name == "@":
            return self.zone
        if name.endswith("."):
            return name
        return f"{name}.{self.zone}"

    @property
    def steering_fqdns(self) -> tuple[str, ...]:
        return tuple(self.absolute(n).lower() for n in self.steering_names)

    @property
    def address(self) -> str:
        """`ip:port` as the activities take it (IPv6 in brackets)."""
        host = f"[{self.bind_address}]" if ":" in self.bind_address else self.bind_address
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class PdnsPaths:
    """The files of one instance, all under its state dir so removing the dir removes it."""

    state_dir: Path

    @property
    def conf(self) -> Path:
        return self.state_dir / "pdns.conf"

    @property
    def database(self) -> Path:
        return self.state_dir / "pdns.sqlite3"

    @property
    def policy(self) -> Path:
        return self.state_dir / "update-policy.lua"

    @property
    def key(self) -> Path:
        return self.state_dir / "tsig-key.json"

    @property
    def log(self) -> Path:
        return self.state_dir / "pdns.log"

    @property
    def pid(self) -> Path:
        return self.state_dir / "pdns.pid"
