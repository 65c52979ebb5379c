"""Wires stack configuration to the telemetry components; called by the thin __main__.py."""

from __future__ import annotations

import pulumi
import pulumiverse_grafana as grafana

from infra.components.grafana import RecoveryDashboards, RecoveryDashboardsArgs
from infra.components.prometheus_files import PrometheusFiles, PrometheusFilesArgs
from infra.components.telemetry_host import TelemetryHost, TelemetryHostArgs
from infra.stack_config import StackSettings, load_settings
from infra.telemetry.prometheus_config import prometheus_file_texts

__all__ = ["build", "main"]


def build(settings: StackSettings) -> dict[str, object]:
    """Declare every host and the Grafana resources; returns the components by name (tests inspect them)."""
    hosts: dict[str, TelemetryHost] = {}
    for spec in settings.hosts:
        peers = [h.address for h in settings.hosts if h.name != spec.name]
        hosts[spec.name] = TelemetryHost(
            spec.name,
            TelemetryHostArgs(
                name=spec.name,
                address=spec.address,
                user=spec.user,
                port=spec.port,
                host_key=spec.host_key,
                ssh_private_key=settings.ssh_private_key,
                targets=settings.targets,
                paging_webhook_url=_paging(settings),
                heartbeat_webhook_url=settings.heartbeat_webhook_url,
                peer_addresses=peers,
                scrape_interval=settings.scrape_interval,
                retention=settings.retention,
                external_labels=settings.external_labels,
                scrape_overrides=settings.scrape_overrides,
                scrape_token_jobs=settings.scrape_token_jobs,
                scrape_tokens=settings.scrape_tokens,
                runbook_base_url=settings.runbook_base_url,
            ),
        )
    result: dict[str, object] = {"hosts": hosts, "prometheus": _prometheus_hosts(settings)}
    pulumi.export("prometheusUrls", {name: h.prometheus_url for name, h in hosts.items()})

    if settings.grafana_url:
        # An explicit provider: the Grafana endpoint comes from this stack's config, nothing ambient.
        provider = grafana.Provider("grafana", url=settings.grafana_url, auth=settings.grafana_auth)
        dashboards = RecoveryDashboards(
            "recovery",
            RecoveryDashboardsArgs(
                prometheus_urls={name: h.prometheus_url for name, h in hosts.items()},
                paging_webhook_url=_paging(settings),
            ),
            opts=pulumi.ResourceOptions(providers=[provider]),
        )
        result["dashboards"] = dashboards
        pulumi.export("recoveryDashboardUid", dashboards.dashboard.uid)
    return result


def _paging(settings: StackSettings) -> pulumi.Output[str]:
    if settings.paging_webhook_url is None:
        raise ValueError("pagingWebhookUrl (a secret) is required with telemetryHosts or grafanaUrl")
    return settings.paging_webhook_url


def _prometheus_hosts(settings: StackSettings) -> dict[str, PrometheusFiles]:
    """The lab's path: the same renderers the lab's own `write_prometheus_files` uses, byte for byte."""
    if not settings.prometheus_hosts:
        return {}
    files = prometheus_file_texts(
        settings.targets, alertmanagers=settings.alertmanagers, external_labels=settings.external_labels,
        scrape_interval=settings.scrape_interval, runbook_base_url=settings.runbook_base_url,
        job_overrides=settings.scrape_overrides, recording_interval=settings.recording_interval,
        group_intervals=settings.group_intervals,
    )
    return {
        spec.name: PrometheusFiles(spec.name, PrometheusFilesArgs(
            address=spec.address, config_dir=spec.config_dir, files=files, reload_url=spec.reload_url,
            user=spec.user, port=spec.port, host_key=spec.host_key, ssh_private_key=settings.ssh_private_key,
        ))
        for spec in settings.prometheus_hosts
    }


def main() -> dict[str, object]:
    return build(load_settings(pulumi.Config()))
