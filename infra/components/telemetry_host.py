"""One dedicated telemetry host: Prometheus, Alertmanager and blackbox exporter from Debian packages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_command import remote

from infra.components.remote_file import deploy_file, sudo_prefix
from infra.telemetry.alertmanager_config import render_alertmanager_config
from infra.telemetry.blackbox_config import render_blackbox_config
from infra.telemetry.prometheus_config import (
    CONFIG_FILENAME,
    RULES_FILENAME,
    dump_yaml,
    render_rules,
    render_scrape_config,
)
from infra.telemetry.targets import ScrapeTargets
from infra.telemetry.thresholds import AlertThresholds

__all__ = ["ALERTMANAGER_PORT", "PACKAGES", "PROMETHEUS_PORT", "TelemetryHost", "TelemetryHostArgs"]

# Debian packages: installable from the distribution mirror, which does not depend on Consul.
PACKAGES = ("prometheus", "prometheus-alertmanager", "prometheus-blackbox-exporter")
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
ALERTMANAGER_CLUSTER_PORT = 9094
ETC = "/etc/prometheus"


@dataclass
class TelemetryHostArgs:
    name: str
    address: str
    targets: ScrapeTargets
    paging_webhook_url: pulumi.Input[str]
    user: str = "root"
    port: int = 22
    host_key: str | None = None
    ssh_private_key: pulumi.Input[str] | None = None
    heartbeat_webhook_url: pulumi.Input[str] | None = None
    # The other telemetry hosts: each Prometheus alerts to every Alertmanager, which cluster together.
    peer_addresses: list[str] = field(default_factory=list)
    scrape_interval: str = "15s"
    retention: str = "30d"
    external_labels: dict[str, str] = field(default_factory=dict)
    scrape_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Bearer tokens for agents with ACLs (Consul, Vault): job names in clear, tokens as a secret map.
    scrape_token_jobs: list[str] = field(default_factory=list)
    scrape_tokens: pulumi.Input[dict[str, str]] | None = None
    thresholds: AlertThresholds = field(default_factory=AlertThresholds)
    runbook_base_url: str = "infra/README.md"


class TelemetryHost(pulumi.ComponentResource):
    """Installs and configures the stack on one host; each file is its own resource keyed by its sha256."""

    def __init__(self, name: str, args: TelemetryHostArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("coldstart:telemetry:TelemetryHost", name, None, opts)
        self.args = args
        child = pulumi.ResourceOptions(parent=self)
        conn = remote.ConnectionArgs(
            host=args.address,
            port=args.port,
            user=args.user,
            private_key=args.ssh_private_key,
            host_key=args.host_key,
        )
        s = sudo_prefix(args.user)
        packages = remote.Command(
            f"{name}-packages",
            connection=conn,
            create=f"{s}env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
            + " ".join(PACKAGES),
            triggers=list(PACKAGES),
            opts=child,
        )
        after_packages = pulumi.ResourceOptions(parent=self, depends_on=[packages])

        self.files: dict[str, remote.Command] = {}  # remote path -> resource
        self._by_key: dict[str, remote.Command] = {}
        self.digests: dict[str, pulumi.Output[str]] = {}

        def put(key: str, path: str, content: pulumi.Input[str], *, owner: str = "root:root", mode: str = "0644",
                check: str | None = None):
            cmd, digest = deploy_file(
                f"{name}-file-{key}", connection=conn, user=args.user, path=path, content=content,
                owner=owner, mode=mode, check=check, opts=after_packages,
            )
            self.files[path] = cmd
            self._by_key[key] = cmd
            self.digests[key] = digest

        # --- Prometheus
        overrides = {job: dict(o) for job, o in args.scrape_overrides.items()}
        secret_jobs = sorted(args.scrape_token_jobs)
        if secret_jobs and args.scrape_tokens is None:
            raise ValueError("scrape_token_jobs given without scrape_tokens")
        for job in secret_jobs:
            overrides.setdefault(job, {})["authorization"] = {
                "type": "Bearer", "credentials_file": f"{ETC}/secrets/{job}.token"}
        self.prometheus_config = render_scrape_config(
            args.targets,
            alertmanagers=[f"{a}:{ALERTMANAGER_PORT}" for a in [args.address, *args.peer_addresses]],
            # `replica` lets Alertmanager dedup the HA pair; the rest identifies the site.
            external_labels={**args.external_labels, "replica": args.name},
            scrape_interval=args.scrape_interval,
            job_overrides=overrides,
        )
        # Each file is checked on its own before it replaces the one in use (the rule and token files it names
        # may not be there yet); the apply step below checks them together.
        put("prometheus-yml", f"{ETC}/{CONFIG_FILENAME}", dump_yaml(self.prometheus_config),
            check='promtool check config --syntax-only "$tmp" >&2')
        put("rules", f"{ETC}/rules/{RULES_FILENAME}",
            dump_yaml(render_rules(args.thresholds, args.runbook_base_url)), check='promtool check rules "$tmp" >&2')
        if secret_jobs:
            assert args.scrape_tokens is not None  # refused above
            tokens = pulumi.Output.secret(args.scrape_tokens)
            for job in secret_jobs:
                put(f"secret-{job}", f"{ETC}/secrets/{job}.token",
                    tokens.apply(lambda m, j=job: m[j]), owner="root:prometheus", mode="0640")
        put("prometheus-defaults", "/etc/default/prometheus",
            f'ARGS="--storage.tsdb.retention.time={args.retention} '
            f'--web.listen-address=:{PROMETHEUS_PORT}"\n')

        # --- Alertmanager (the config holds the paging URL: it stays a secret end to end)
        am_config = pulumi.Output.secret(
            pulumi.Output.all(args.paging_webhook_url, args.heartbeat_webhook_url).apply(
                lambda urls: dump_yaml(render_alertmanager_config(urls[0], urls[1]))
            )
        )
        put("alertmanager-yml", f"{ETC}/alertmanager.yml", am_config, owner="root:prometheus", mode="0640")
        peers = " ".join(f"--cluster.peer={p}:{ALERTMANAGER_CLUSTER_PORT}" for p in args.peer_addresses)
        cluster = f"--cluster.listen-address=:{ALERTMANAGER_CLUSTER_PORT}" + (f" {peers}" if peers else "")
        put("alertmanager-defaults", "/etc/default/prometheus-alertmanager", f'ARGS="{cluster}"\n')

        # --- Blackbox exporter
        put("blackbox-yml", f"{ETC}/blackbox.yml", dump_yaml(render_blackbox_config()))

        # --- Validate, then reload. A bad file fails the deploy while the old config keeps running.
        def apply(key: str, unit: str, check: str, watched: list[str], defaults_key: str | None):
            deps = [self._by_key[k] for k in watched]
            cmd = remote.Command(
                f"{name}-{key}",
                connection=conn,
                create=f"set -eu; {s}{check}; {s}systemctl enable --now {unit}; {s}systemctl reload-or-restart {unit}",
                triggers=[self.digests[k] for k in watched],
                opts=pulumi.ResourceOptions(parent=self, depends_on=deps),
            )
            if defaults_key:
                # Command-line flags only change on restart; a reload would silently ignore them.
                remote.Command(
                    f"{name}-{key}-restart",
                    connection=conn,
                    create=f"set -eu; {s}systemctl restart {unit}",
                    triggers=[self.digests[defaults_key]],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[cmd, self._by_key[defaults_key]]),
                )
            return cmd

        prom_keys = ["prometheus-yml", "rules", *[f"secret-{j}" for j in secret_jobs]]
        self.prometheus_apply = apply("prometheus-apply", "prometheus",
                                      f"promtool check config {ETC}/{CONFIG_FILENAME}", prom_keys, "prometheus-defaults")
        self.alertmanager_apply = apply("alertmanager-apply", "prometheus-alertmanager",
                                        f"amtool check-config {ETC}/alertmanager.yml", ["alertmanager-yml"],
                                        "alertmanager-defaults")
        self.blackbox_apply = apply("blackbox-apply", "prometheus-blackbox-exporter",
                                    f"prometheus-blackbox-exporter --config.check --config.file={ETC}/blackbox.yml",
                                    ["blackbox-yml"], None)

        self.prometheus_url = f"http://{args.address}:{PROMETHEUS_PORT}"
        self.register_outputs({
            "prometheusUrl": self.prometheus_url,
            "alertmanagerUrl": f"http://{args.address}:{ALERTMANAGER_PORT}",
            "files": sorted(self.files),
        })
