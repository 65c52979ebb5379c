"""The worker's readiness activity: a runbook from its own catalog, checked from the worker's own host and queue.

Where the report's metrics go is the worker's configuration, read when it starts ($COLDSTART_READINESS_METRICS_DIR,
$COLDSTART_READINESS_PUSH), never the request's: whoever can start a workflow or edit a Schedule writes the
request, and a file path or URL from it would let them choose what the worker overwrites or where it sends."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.registry import Registry
from runtime.action_versions import catalog_build_id
from runtime.catalog import Catalog, CatalogRefused
from runtime.readiness.metrics import push_report, write_textfile
from runtime.readiness.model import Report
from runtime.readiness.plan import ReadinessSettings, plan_checks
from runtime.readiness.runner import run_checks
from runtime.readiness.transitions import offer_transition
from runtime.readiness.vault_login import worker_vault_token
from workflows.loader import RunbookInvalid, plan_run
from workflows.names import check_name
from workflows.notices import event_sink
from workflows.readiness import READINESS_ACTIVITY, ReadinessRequest

__all__ = ["METRICS_DIR_ENV", "PUSH_ENV", "ReadinessExport", "ScheduledReadiness"]

METRICS_DIR_ENV = "COLDSTART_READINESS_METRICS_DIR"
PUSH_ENV = "COLDSTART_READINESS_PUSH"


@dataclass(frozen=True)
class ReadinessExport:
    """Where this worker exports its scheduled checks' metrics: node_exporter's textfile directory (one file per
    runbook and target, so the checks of several runbooks do not overwrite each other) and a Pushgateway (a
    group per runbook and target). Neither set: the report is the workflow's result only."""

    metrics_dir: Path | None = None
    push: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> ReadinessExport:
        """$COLDSTART_READINESS_METRICS_DIR and $COLDSTART_READINESS_PUSH (an http(s) URL); ValueError naming the
        variable when the URL is not one."""
        directory = environ.get(METRICS_DIR_ENV, "").strip()
        push = environ.get(PUSH_ENV, "").strip()
        if push and (urlsplit(push).scheme not in ("http", "https") or not urlsplit(push).netloc):
            raise ValueError(f"${PUSH_ENV} is not a Pushgateway URL (http or https): {push[:80]!r}")
        return cls(metrics_dir=Path(directory) if directory else None, push=push or None)

    def textfile(self, runbook: str, target: str) -> Path | None:
        """The file for one runbook and target: their names, checked as names (no path of their own), in the
        directory. A runbook's name has no `_` (workflows/spec.py), so no two pairs share a file."""
        if self.metrics_dir is None:
            return None
        return self.metrics_dir / f"coldstart_readiness_{check_name('runbook', runbook)}_{check_name('target', target)}.prom"

    def export(self, report: Report, runbook: str, target: str) -> None:
        """Write and push as configured (both tried); a non-retryable ApplicationError in one line for what failed."""
        failed = []
        path = self.textfile(runbook, target)
        if path is not None:
            try:
                write_textfile(report, path)
            except OSError as exc:  # a directory that is missing or not writable
                failed.append(f"cannot write {path}: {_reason(exc)}")
        if self.push is not None:
            try:
                push_report(report, self.push)
            except OSError as exc:  # a Pushgateway that refuses or does not answer (urllib's errors are OSErrors)
                failed.append(f"cannot push to {self.push}: {_reason(exc)}")
        if failed:
            raise ApplicationError(f"readiness metrics not exported: {'; '.join(failed)}", type="ExportFailed",
                                   non_retryable=True)


def _reason(exc: OSError) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__


class ScheduledReadiness:
    """The `coldstart.readiness` activity. export: where the metrics go (default: the environment's, read now)."""

    def __init__(self, catalog: Catalog, registry: Registry, export: ReadinessExport | None = None) -> None:
        self._catalog = catalog
        self._registry = registry
        self._export = export if export is not None else ReadinessExport.from_environment()

    @activity.defn(name=READINESS_ACTIVITY)
    async def check(self, request: ReadinessRequest) -> dict[str, Any]:
        """The report as JSON; the metrics exported where this worker is configured to."""
        # Everything checked comes from the catalog: the runbook by name, the target's inventory by name.
        held = sorted((e for e in self._catalog.runbooks().values() if e.name == request.runbook),
                      key=lambda e: str(e.path))
        if not held:
            raise ApplicationError(f"runbook {request.runbook!r} is not in the worker's catalog",
                                   type="CatalogRefused", non_retryable=True)
        try:
            run = plan_run(held[0].path, text=held[0].text, registry=self._registry, params=request.params,
                           inventory=self._catalog.inventory(request.target), placeholders=True)
        except RunbookInvalid as exc:
            raise ApplicationError(f"runbook {request.runbook!r} does not plan: {exc.errors[0]}",
                                   type="RunbookInvalid", non_retryable=True) from None
        except CatalogRefused as exc:
            raise ApplicationError(str(exc), type="CatalogRefused", non_retryable=True) from None
        client = activity.client()

        async def connected() -> Client:
            return client

        settings = ReadinessSettings(connect=connected, frontend=client.service_client.config.target_host,
                                     task_queue=activity.info().task_queue,
                                     build_id=catalog_build_id(self._registry), timeout=request.timeout_seconds,
                                     trial_restore=request.trial_restore)
        async with worker_vault_token(run.target) as login:
            try:
                checks = plan_checks(run, replace(settings, vault=login))
            except ValueError as exc:  # a target fact that is not valid (facts.rpo)
                raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from None
            report = await run_checks(run.runbook.metadata.name, run.target_name, checks)
        self._export.export(report, request.runbook, request.target)
        # The worker's notifier (set with its runs' events) returns at once; none set, nothing is sent.
        offer_transition(report, command=f"coldstart readiness {held[0].path} --target {run.target_name}",
                         offer=event_sink())
        return report.as_json()
