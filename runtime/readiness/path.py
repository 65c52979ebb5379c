"""Out of band: an endpoint behind the runbook's client block must stay reachable from here, through an allowed tier."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from runtime.readiness.model import Verdict, not_ready, ready, unknown

__all__ = ["source_address", "through_block_verdict"]


def source_address(host: str, port: int) -> str:
    """The address this host sends from to reach host:port (the kernel's route; a UDP connect sends nothing)."""
    family, _, _, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(where)
        return str(probe.getsockname()[0])


def _check(url: str, tiers: dict[str, list[str]], step: str) -> Verdict:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        source = ipaddress.ip_address(source_address(parts.hostname or "", port))
    except (OSError, ValueError) as exc:
        return unknown(f"cannot tell this host's address towards {url}: {exc}")
    for tier, cidrs in tiers.items():
        if any(source in ipaddress.ip_network(cidr, strict=False) for cidr in cidrs):
            return ready(f"after {step} blocks clients, this host ({source}) still reaches {url} as tier {tier}")
    return not_ready(f"after {step} blocks clients, this host ({source}) is in no allowed tier "
                     f"({', '.join(tiers)}) and loses {url}")


async def through_block_verdict(url: str, tiers: dict[str, list[str]], step: str) -> Verdict:
    return await asyncio.to_thread(_check, url, tiers, step)
