"""Renders the blackbox exporter's modules (the players' outside view of the edge and DNS)."""

from __future__ import annotations

__all__ = ["render_blackbox_config"]


def render_blackbox_config() -> dict:
    """blackbox.yml as a dict; module names match the probe jobs in prometheus_config."""
    return {
        "modules": {
            "http_2xx": {
                "prober": "http",
                "timeout": "5s",
                # IPv4 first: the probed names live in public/internal DNS, never Consul DNS.
                "http": {"preferred_ip_protocol": "ip4", "follow_redirects": False},
            },
            "tcp_connect": {"prober": "tcp", "timeout": "5s", "tcp": {"preferred_ip_protocol": "ip4"}},
        }
    }
