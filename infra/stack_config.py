"""Reads the stack configuration (pulumi.Config) into plain dataclasses the components take."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi

from infra.telemetry.rules import DEFAULT_RUNBOOK_BASE
from infra.telemetry.targets import ScrapeTargets

__all__ = ["HostSpec", "StackSettings", "load_settings"]


@dataclass(frozen=True)
class HostSpec:
    """A dedicated telemetry host reached over SSH by IP (or a non-Consul name)."""

    name: str
    address: str
    user: str = "root"
    port: int = 22
    # Pin the host key: without it a spoofed host could receive the paging secret.
    host_key: str | None = None


@dataclass(frozen=True)
class StackSettings:
    hosts: list[HostSpec]
    targets: ScrapeTargets
    paging_webhook_url: pulumi.Output[str]
    heartbeat_webhook_url: pulumi.Output[str] | None
    ssh_private_key: pulumi.Output[str] | None
    scrape_token_jobs: list[str]
    scrape_tokens: pulumi.Output[Any] | None
    grafana_url: str | None
    grafana_auth: pulumi.Output[str] | None
    scrape_interval: str = "15s"
    retention: str = "30d"
    external_labels: dict[str, str] = field(default_factory=dict)
    scrape_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE


def load_settings(config: pulumi.Config | None = None) -> StackSettings:
    """Config keys are documented in infra/README.md; secrets are Pulumi secrets, never Vault paths."""
    config = config or pulumi.Config()
    hosts = [
        HostSpec(
            name=h["name"],
            address=h["address"],
            user=h.get("user", "root"),
            port=int(h.get("port", 22)),
            host_key=h.get("hostKey"),
        )
        for h in config.require_object("telemetryHosts")
    ]
    if not hosts:
        raise ValueError("telemetryHosts must list at least one host")
    if len({h.name for h in hosts}) != len(hosts):
        raise ValueError("telemetryHosts names must be unique")
    return StackSettings(
        hosts=hosts,
        targets=ScrapeTargets.from_mapping(config.require_object("targets")),
        paging_webhook_url=config.require_secret("pagingWebhookUrl"),
        heartbeat_webhook_url=config.get_secret("heartbeatWebhookUrl"),
        ssh_private_key=config.get_secret("sshPrivateKey"),
        # Job names in clear (they shape the resource graph); tokens only as a secret map.
        scrape_token_jobs=list(config.get_object("scrapeTokenJobs") or []),
        scrape_tokens=config.get_secret_object("scrapeTokens"),
        grafana_url=config.get("grafanaUrl"),
        grafana_auth=config.get_secret("grafanaAuth"),
        scrape_interval=config.get("scrapeInterval") or "15s",
        retention=config.get("retention") or "30d",
        external_labels=dict(config.get_object("externalLabels") or {}),
        scrape_overrides=dict(config.get_object("scrapeOverrides") or {}),
        runbook_base_url=config.get("runbookBaseUrl") or DEFAULT_RUNBOOK_BASE,
    )
