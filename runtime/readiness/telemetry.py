"""The gates' telemetry must not depend on what the runbook recovers: the live Prometheus config, read from its API."""

from __future__ import annotations

import re
from typing import Any

import httpx
import yaml

from runtime.readiness.model import Verdict, not_ready, ready, unknown

__all__ = ["RESTORED_SD", "config_dependencies", "telemetry_verdict"]

# Service discovery through a system a cold start restores: while it is down, Prometheus loses its targets.
RESTORED_SD = ("consul_sd_configs", "nomad_sd_configs")
# A name in Consul's DNS domain resolves only while Consul answers.
_CONSUL_NAME = re.compile(r"(?<![A-Za-z0-9.-])((?:[A-Za-z0-9_-]+\.)+consul)\.?(?=$|[:/\s'\",\]])", re.MULTILINE)


def _walk(node: Any, where: str, found: list[str]) -> None:
    if isinstance(node, dict):
        name = node.get("job_name")
        here = f"job {name}" if isinstance(name, str) else where
        for key, value in node.items():
            if key in RESTORED_SD and value:
                found.append(f"{here} uses {key}")
            _walk(value, here, found)
    elif isinstance(node, list):
        for item in node:
            _walk(item, where, found)


def config_dependencies(config_yaml: str) -> list[str]:
    """What in a Prometheus config needs Consul or Nomad up: their service discovery, Consul DNS names."""
    found: list[str] = []
    _walk(yaml.safe_load(config_yaml) or {}, "config", found)
    names = sorted({match.group(1) for match in _CONSUL_NAME.finditer(config_yaml)})
    found.extend(f"names {name}, a Consul DNS name" for name in names)
    return found


async def telemetry_verdict(prometheus: str, *, timeout: float = 5.0) -> Verdict:
    url = prometheus.rstrip("/") + "/api/v1/status/config"
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            reply = await http.get(url)
    except httpx.TransportError as exc:
        return not_ready(f"Prometheus at {prometheus} does not answer ({type(exc).__name__}): the gates are blind")
    if reply.status_code != 200:
        return unknown(f"{url} answered HTTP {reply.status_code}")
    try:
        config = reply.json()["data"]["yaml"]
    except (ValueError, KeyError, TypeError):
        return unknown(f"{url} did not answer a Prometheus config")
    found = config_dependencies(config)
    if found:
        return not_ready(f"the live config of {prometheus} depends on what the runbook recovers: {'; '.join(found)}")
    return ready(f"the live config of {prometheus} has no Consul or Nomad discovery and no Consul DNS names")
