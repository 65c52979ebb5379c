"""A PowerDNS authoritative server for the lab, serving the DNS steering record."""

from lab.dns.config import LaunchSpec, launch_spec, render_conf
from lab.dns.policy import render_policy
from lab.dns.server import (
    PdnsLab,
    PdnsProcess,
    free_dns_port,
    prepare,
    start,
    stop,
    tsig_key_material,
    wait_until_answering,
)
from lab.dns.settings import PdnsPaths, PdnsSettings
from lab.dns.tsig import TsigKey, generate_key

__all__ = [
    "LaunchSpec",
    "PdnsLab",
    "PdnsPaths",
    "PdnsProcess",
    "PdnsSettings",
    "TsigKey",
    "free_dns_port",
    "generate_key",
    "launch_spec",
    "prepare",
    "render_conf",
    "render_policy",
    "start",
    "stop",
    "tsig_key_material",
    "wait_until_answering",
]
