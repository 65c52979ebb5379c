"""Dependency policy: telemetry resources must not depend on Consul, Nomad or Vault in any way."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ResourceRecord", "Violation", "find_violations", "watched_hosts"]

# Providers for the watched systems: reading anything through them needs them healthy.
_FORBIDDEN_TYPE_PREFIXES = ("consul:", "nomad:", "vault:")
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Any discovery but static/file resolves targets through a live system (Consul, Nomad, DNS).
    ("service discovery", re.compile(r"\b(?!static_|file_)[a-z0-9]+_sd_configs?\b")),
    # Consul DNS names only resolve while Consul is healthy.
    (".consul name", re.compile(r"[A-Za-z0-9-]\.consul\.?(?![A-Za-z0-9_-])", re.IGNORECASE)),
    # Secrets fetched from Vault at deploy or run time.
    ("Vault lookup", re.compile(
        r"\bvault\s+(kv|read|write|login|token)\b|\bVAULT_(ADDR|TOKEN)\b|\bvault://|/v1/(secret|kv)/"
        r"|\{\{\s*with\s+secret\b", re.IGNORECASE)),
    # Consul/Nomad CLIs or templates used as a source of configuration.
    # Case-sensitive: CLIs are lowercase, and prose such as "Consul KV apply" is not a lookup.
    ("Consul/Nomad lookup", re.compile(
        r"\bconsul\s+(kv|catalog|members|watch)\s|\bnomad\s+(var|job\s+status|node\s+status)\b"
        r"|\bCONSUL_HTTP_ADDR\b|\bNOMAD_ADDR\b|consul-template|\{\{\s*(key|service|range\s+service)\b")),
)


@dataclass(frozen=True)
class ResourceRecord:
    """A resource as the engine (or the test mocks) saw it: type token, name and resolved inputs."""

    type_: str
    name: str
    inputs: dict[str, Any]


@dataclass(frozen=True)
class Violation:
    resource: str
    rule: str
    evidence: str

    def __str__(self) -> str:
        return f"{self.resource}: {self.rule}: {self.evidence}"


def watched_hosts(targets: Any) -> set[str]:
    """Hosts of the Consul, Nomad and Vault servers: telemetry must not run on or through them."""
    hosts: set[str] = set()
    for job in ("consul", "nomad", "vault"):
        for target in getattr(targets, job):
            hosts.add(target.rpartition(":")[0].strip("[]").lower())
    return hosts


_SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's marker for a secret value


def _unwrap(value: Any) -> Any:
    """Secrets are checked like everything else: a secret webhook on a Consul name is still a dependency."""
    if isinstance(value, dict):
        if _SECRET_SIG in value:
            return _unwrap(value.get("value"))
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_unwrap(v) for v in value]
    return value


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield path + "/" + str(k), str(k)
            yield from _strings(v, f"{path}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"]+", re.IGNORECASE)


def _url_hosts(text: str) -> Iterator[str]:
    # A Prometheus config lists watched servers on purpose: those are targets, not dependencies.
    if "scrape_configs:" in text:
        return
    for url in _URL.findall(text):
        try:
            host = urlsplit(url).hostname
        except ValueError:
            continue
        if host:
            yield host.lower()


def find_violations(resources: Iterable[ResourceRecord], watched: Iterable[str] = ()) -> list[Violation]:
    """Every way a telemetry resource would go dark with Consul, Nomad or Vault; empty means compliant."""
    watched_set = {h.lower() for h in watched}
    found: list[Violation] = []
    for res in resources:
        label = f"{res.type_}::{res.name}"
        if res.type_.startswith(_FORBIDDEN_TYPE_PREFIXES):
            found.append(Violation(label, "provider of a watched system", res.type_))
        inputs = _unwrap(res.inputs)
        connection = inputs.get("connection")
        if isinstance(connection, dict) and str(connection.get("host", "")).lower() in watched_set:
            found.append(Violation(label, "telemetry runs on a watched server", str(connection["host"])))
        for path, text in _strings(inputs):
            for rule, pattern in _RULES:
                m = pattern.search(text)
                if m:
                    found.append(Violation(label, rule, f"{path}: ...{text[max(0, m.start() - 30):m.end() + 30]}..."))
            # Grafana, webhooks, data sources: an endpoint on a watched server shares its fate.
            for host in _url_hosts(text):
                if host in watched_set:
                    found.append(Violation(label, "endpoint on a watched server", f"{path}: {host}"))
    return found
