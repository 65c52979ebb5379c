"""Readiness: the recovery path a runbook needs, checked on an ordinary day (ready, not ready or unknown, with evidence)."""

from runtime.readiness.metrics import push_report, render_registry, write_textfile
from runtime.readiness.model import EXIT_CODES, METRIC_VALUES, Check, Report, Result, State, Verdict
from runtime.readiness.plan import ReadinessSettings, plan_checks
from runtime.readiness.runner import run_checks

__all__ = ["EXIT_CODES", "METRIC_VALUES", "Check", "ReadinessSettings", "Report", "Result", "State", "Verdict",
           "plan_checks", "push_report", "render_registry", "run_checks", "write_textfile"]
