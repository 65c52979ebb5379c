"""Out-of-band telemetry: plain-Python renderers (no Pulumi import) shared by production and the lab."""

from infra.telemetry.prometheus_config import (
    render_rules,
    render_scrape_config,
    write_prometheus_files,
)
from infra.telemetry.targets import ScrapeTargets
from infra.telemetry.thresholds import AlertThresholds

__all__ = [
    "AlertThresholds",
    "ScrapeTargets",
    "render_rules",
    "render_scrape_config",
    "write_prometheus_files",
]
