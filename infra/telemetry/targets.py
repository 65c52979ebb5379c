"""The scrape-target shape shared by the Pulumi stack config and the drill lab."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["ForbiddenTargetError", "ScrapeTargets", "check_static_address"]

# Telemetry must not resolve anything through Consul: a `.consul` name only resolves while
# Consul DNS is healthy, which is exactly when we do not need the alerts.
_FORBIDDEN_SUFFIXES = (".consul", ".consul.")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")


class ForbiddenTargetError(ValueError):
    """A target would make telemetry depend on the systems it watches (Consul DNS)."""


def check_static_address(target: str) -> str:
    """Validate a "host:port" target: an IP or a non-Consul name, and a port; returns it unchanged."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"target {target!r} is not host:port")
    host = host.strip("[]")  # bracketed IPv6
    try:
        ipaddress.ip_address(host)
        return target
    except ValueError:
        pass
    if host.lower().endswith(_FORBIDDEN_SUFFIXES) or ".consul." in host.lower():
        raise ForbiddenTargetError(f"target {target!r} resolves through Consul DNS")
    if not _HOSTNAME.match(host):
        raise ValueError(f"target {target!r} has an invalid host")
    return target


@dataclass(frozen=True)
class ScrapeTargets:
    """Static "host:port" lists per scrape job; URLs for blackbox HTTP probes."""

    consul: list[str] = field(default_factory=list)
    nomad: list[str] = field(default_factory=list)
    vault: list[str] = field(default_factory=list)
    dns: list[str] = field(default_factory=list)
    cache: list[str] = field(default_factory=list)
    game_edge: list[str] = field(default_factory=list)
    players: list[str] = field(default_factory=list)
    internal_load: list[str] = field(default_factory=list)
    coldstart_worker: list[str] = field(default_factory=list)
    # cAdvisor (or the lab's compatible exporter): per-process CFS throttling of the Consul servers.
    containers: list[str] = field(default_factory=list)
    # Session routers: stuck-session time buckets (coldstart_session_stuck_seconds).
    sessions: list[str] = field(default_factory=list)
    # The telemetry stack watches itself (and its HA peer): Prometheus, Alertmanager, blackbox.
    telemetry: list[str] = field(default_factory=list)
    blackbox_http: list[str] = field(default_factory=list)
    blackbox_tcp: list[str] = field(default_factory=list)
    # Where Prometheus reaches the blackbox exporter; on a telemetry host it is local.
    blackbox_exporter: str = "127.0.0.1:9115"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "blackbox_http":
                for url in value:
                    _check_url(url)
            elif f.name == "blackbox_exporter":
                check_static_address(value)
            else:
                if isinstance(value, str):
                    raise TypeError(f"{f.name} must be a list of host:port, not a string")
                for target in value:
                    check_static_address(target)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ScrapeTargets:
        """Build from stack config / lab YAML; accepts camelCase or snake_case keys."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            name = _snake(key)
            if name not in known:
                raise ValueError(f"unknown scrape target job {key!r}; known: {sorted(known)}")
            kwargs[name] = value if isinstance(value, str) else list(value)
        return cls(**kwargs)

    def jobs(self) -> dict[str, list[str]]:
        """The plain metrics-scrape jobs (not blackbox probes) that have targets."""
        skip = {"blackbox_http", "blackbox_tcp", "blackbox_exporter"}
        return {f.name: list(getattr(self, f.name)) for f in fields(self) if f.name not in skip and getattr(self, f.name)}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _check_url(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"blackbox http probe {url!r} is not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    check_static_address(f"{parts.hostname}:{port}")
