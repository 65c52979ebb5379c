"""Readiness as Prometheus metrics: a textfile for node_exporter, or a push to a Pushgateway."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway, write_to_textfile

from runtime.readiness.model import METRIC_VALUES, Report

__all__ = ["PUSH_JOB", "push_report", "render_registry", "write_textfile"]

PUSH_JOB = "coldstart_readiness"


def render_registry(report: Report) -> CollectorRegistry:
    """coldstart_readiness{runbook,target,check}: 1 ready, 0 not ready, -1 unknown; and when it was checked,
    so an alert tells a readiness that stopped running from one that is green."""
    registry = CollectorRegistry()
    state = Gauge("coldstart_readiness", "Recovery readiness per check: 1 ready, 0 not ready, -1 unknown",
                  ["runbook", "target", "check"], registry=registry)
    for result in report.results:
        state.labels(report.runbook, report.target, result.check).set(METRIC_VALUES[result.state])
    checked = Gauge("coldstart_readiness_checked_timestamp_seconds", "When the readiness checks last ran",
                    ["runbook", "target"], registry=registry)
    checked.labels(report.runbook, report.target).set(report.checked_at)
    return registry


def write_textfile(report: Report, path: Path) -> None:
    """Written atomically (a temporary file renamed), as node_exporter's textfile collector requires."""
    write_to_textfile(str(path), render_registry(report))


def push_report(report: Report, gateway: str) -> None:
    """Replaces this runbook and target's group on the Pushgateway, so a check that disappeared leaves no series."""
    push_to_gateway(gateway, job=PUSH_JOB, registry=render_registry(report),
                    grouping_key={"runbook": report.runbook, "target": report.target})
