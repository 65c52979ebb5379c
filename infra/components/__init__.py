"""Pulumi ComponentResources for the out-of-band telemetry stack."""

from infra.components.grafana import RecoveryDashboards, RecoveryDashboardsArgs
from infra.components.telemetry_host import TelemetryHost, TelemetryHostArgs

__all__ = ["RecoveryDashboards", "RecoveryDashboardsArgs", "TelemetryHost", "TelemetryHostArgs"]
