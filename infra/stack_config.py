"""Reads the stack configuration (pulumi.Config) into plain dataclasses the components take."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi

from infra.telemetry.rules import DEFAULT_RUNBOOK_BASE
from infra.telemetry.targets import ScrapeTargets

__all__ = ["HostSpec", "PrometheusHostSpec", "StackSettings", "load_settings"]


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
class PrometheusHostSpec:
    """A Prometheus run by someone else (the lab's): only its config and rules are deployed, then reloaded."""

    name: str
    address: str
    config_dir: str
    reload_url: str
    user: str = "root"
    port: int = 22
    host_key: str | None = None


@dataclass(frozen=True)
class StackSettings:
    hosts: list[HostSpec]
    targets: ScrapeTargets
    paging_webhook_url: pulumi.Output[str] | None
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
    prometheus_hosts: list[PrometheusHostSpec] = field(default_factory=list)
    # Only for prometheusHosts (TelemetryHost renders its own Alertmanager list and intervals).
    alertmanagers: list[str] = field(default_factory=list)
    recording_interval: str = "15s"
    group_intervals: dict[str, str] = field(default_factory=dict)


def _ssh_key(config: pulumi.Config) -> pulumi.Output[str] | None:
    key = config.get_secret("sshPrivateKey")
    path = config.get("sshPrivateKeyPath")
    if key is not None and path:
        raise ValueError("set sshPrivateKey or sshPrivateKeyPath, not both")
    if path:
        # A key file on the machine running pulumi (the lab's client key): read now, kept secret.
        with open(path) as fh:
            return pulumi.Output.secret(fh.read())
    return key


def _ssh_fields(h: dict[str, Any]) -> dict[str, Any]:
    return {"name": h["name"], "address": h["address"], "user": h.get("user", "root"),
            "port": int(h.get("port", 22)), "host_key": h.get("hostKey")}


def load_settings(config: pulumi.Config | None = None) -> StackSettings:
    """Config keys are documented in infra/README.md; secrets are Pulumi secrets, never Vault paths."""
    config = config or pulumi.Config()
    hosts = [HostSpec(**_ssh_fields(h)) for h in config.get_object("telemetryHosts") or []]
    prometheus_hosts = [
        PrometheusHostSpec(**_ssh_fields(h), config_dir=h["configDir"], reload_url=h["reloadUrl"])
        for h in config.get_object("prometheusHosts") or []
    ]
    if not hosts and not prometheus_hosts:
        raise ValueError("telemetryHosts (or prometheusHosts) must list at least one host")
    names = [h.name for h in hosts] + [h.name for h in prometheus_hosts]
    if len(set(names)) != len(names):
        raise ValueError("telemetryHosts and prometheusHosts names must be unique")
    paging = config.get_secret("pagingWebhookUrl")
    if paging is None and (hosts or config.get("grafanaUrl")):
        raise ValueError("pagingWebhookUrl (a secret) is required with telemetryHosts or grafanaUrl")
    return StackSettings(
        hosts=hosts,
        prometheus_hosts=prometheus_hosts,
        targets=ScrapeTargets.from_mapping(config.require_object("targets")),
        paging_webhook_url=paging,
        heartbeat_webhook_url=config.get_secret("heartbeatWebhookUrl"),
        ssh_private_key=_ssh_key(config),
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
        alertmanagers=list(config.get_object("alertmanagers") or []),
        recording_interval=config.get("recordingInterval") or "15s",
        group_intervals=dict(config.get_object("groupIntervals") or {}),
    )
