"""Renders prometheus.yml and the rules file from ScrapeTargets; importable without a Pulumi engine."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from infra.telemetry.rules import DEFAULT_RUNBOOK_BASE, RULES_FILENAME
from infra.telemetry.rules import render_rules as _render_rules
from infra.telemetry.targets import ScrapeTargets, check_static_address
from infra.telemetry.thresholds import AlertThresholds

__all__ = [
    "CONFIG_FILENAME",
    "METRICS_PATHS",
    "RULES_FILENAME",
    "dump_yaml",
    "prometheus_file_texts",
    "render_rules",
    "render_scrape_config",
    "write_prometheus_files",
]

CONFIG_FILENAME = "prometheus.yml"

# HashiCorp agents serve Prometheus format only when asked; the default is their JSON format.
METRICS_PATHS: dict[str, tuple[str, dict[str, list[str]]]] = {
    "consul": ("/v1/agent/metrics", {"format": ["prometheus"]}),
    "nomad": ("/v1/metrics", {"format": ["prometheus"]}),
    "vault": ("/v1/sys/metrics", {"format": ["prometheus"]}),
}

_BLACKBOX_MODULES = {"blackbox_http": "http_2xx", "blackbox_tcp": "tcp_connect"}
# Only static (and file) discovery: everything else resolves through a system we watch.
_ALLOWED_OVERRIDE_KEYS = {
    "scheme", "tls_config", "authorization", "basic_auth", "scrape_interval", "scrape_timeout",
    "metric_relabel_configs", "relabel_configs", "sample_limit", "honor_labels",
}


def render_rules(thresholds: AlertThresholds | None = None, runbook_base_url: str = DEFAULT_RUNBOOK_BASE,
                 recording_interval: str = "15s",
                 group_intervals: Mapping[str, str] | None = None) -> dict:
    """The rules file (recording + alert groups) as a dict; see infra.telemetry.rules."""
    return _render_rules(thresholds, runbook_base_url, recording_interval, dict(group_intervals or {}))


def render_scrape_config(
    targets: ScrapeTargets,
    *,
    alertmanagers: Sequence[str] = (),
    external_labels: Mapping[str, str] | None = None,
    scrape_interval: str = "15s",
    job_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    rule_files: Sequence[str] = (f"rules/{RULES_FILENAME}",),
) -> dict:
    """prometheus.yml as a dict: static_configs only, one job per non-empty ScrapeTargets list."""
    job_overrides = job_overrides or {}
    scrape_configs: list[dict] = []
    for job, hosts in targets.jobs().items():
        cfg: dict[str, Any] = {"job_name": job}
        if job in METRICS_PATHS:
            path, params = METRICS_PATHS[job]
            cfg["metrics_path"] = path
            cfg["params"] = copy.deepcopy(params)
        cfg["static_configs"] = [{"targets": sorted(hosts)}]
        cfg.update(_checked_override(job, job_overrides.get(job, {})))
        scrape_configs.append(cfg)
    for job, module in _BLACKBOX_MODULES.items():
        probes = getattr(targets, job)
        if not probes:
            continue
        cfg = {
            "job_name": job,
            "metrics_path": "/probe",
            "params": {"module": [module]},
            "static_configs": [{"targets": sorted(probes)}],
            # The probed endpoint becomes ?target= and the instance label; the exporter is the address.
            "relabel_configs": [
                {"source_labels": ["__address__"], "target_label": "__param_target"},
                {"source_labels": ["__param_target"], "target_label": "instance"},
                {"target_label": "__address__", "replacement": targets.blackbox_exporter},
            ],
        }
        cfg.update(_checked_override(job, job_overrides.get(job, {})))
        scrape_configs.append(cfg)
    unknown = set(job_overrides) - {c["job_name"] for c in scrape_configs}
    if unknown:
        raise ValueError(f"overrides for jobs without targets: {sorted(unknown)}")

    config: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": scrape_interval,
            # Under distress Consul answers slowly; give it most of the interval before marking down.
            "scrape_timeout": "10s",
            "external_labels": dict(external_labels or {}),
        },
        "rule_files": list(rule_files),
        "scrape_configs": scrape_configs,
    }
    if alertmanagers:
        config["alerting"] = {
            # Every Prometheus replica sends to every Alertmanager; the Alertmanager cluster dedups.
            "alertmanagers": [{"static_configs": [{"targets": [check_static_address(a) for a in alertmanagers]}]}]
        }
    return config


def _checked_override(job: str, override: Mapping[str, Any]) -> dict:
    bad = set(override) - _ALLOWED_OVERRIDE_KEYS
    if bad:
        raise ValueError(f"job {job!r}: override keys {sorted(bad)} are not allowed (static targets only)")
    # Keys in a fixed order: the same override gives the same bytes (and sha256) whether it came from
    # Python (the lab) or from Pulumi's config, which hands objects over with their keys sorted.
    return _key_sorted(copy.deepcopy(dict(override)))


def _key_sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _key_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_key_sorted(v) for v in value]
    return value


def dump_yaml(data: Mapping[str, Any]) -> str:
    """Stable YAML text: the sha256 of it decides whether a host gets a re-deploy."""
    header = "# Generated by infra/telemetry (coldstart). Do not edit: change the Python and re-render.\n"
    return header + yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False, width=1000)


def prometheus_file_texts(
    targets: ScrapeTargets,
    *,
    alertmanagers: Sequence[str] = (),
    external_labels: Mapping[str, str] | None = None,
    scrape_interval: str = "15s",
    thresholds: AlertThresholds | None = None,
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE,
    job_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    recording_interval: str = "15s",
    group_intervals: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """{relative path: text} of prometheus.yml and the rules file, as the lab writes and Pulumi deploys them."""
    config = render_scrape_config(targets, alertmanagers=alertmanagers, external_labels=external_labels,
                                  scrape_interval=scrape_interval, job_overrides=job_overrides)
    rules = render_rules(thresholds, runbook_base_url, recording_interval, dict(group_intervals or {}))
    return {CONFIG_FILENAME: dump_yaml(config), f"rules/{RULES_FILENAME}": dump_yaml(rules)}


def write_prometheus_files(dest_dir: str | Path, targets: ScrapeTargets, **options: Any) -> dict[str, Path]:
    """Write prometheus.yml and rules/coldstart.rules.yml under dest_dir; returns {role: path}.

    `options` are prometheus_file_texts' keyword arguments.
    """
    dest = Path(dest_dir)
    (dest / "rules").mkdir(parents=True, exist_ok=True)
    texts = prometheus_file_texts(targets, **options)
    paths = {"config": dest / CONFIG_FILENAME, "rules": dest / "rules" / RULES_FILENAME}
    paths["config"].write_text(texts[CONFIG_FILENAME])
    paths["rules"].write_text(texts[f"rules/{RULES_FILENAME}"])
    return paths
