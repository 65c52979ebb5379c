"""The worker's readiness activity: a runbook from its own catalog, checked from the worker's own host and queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.registry import Registry
from runtime.action_versions import catalog_build_id
from runtime.catalog import Catalog, CatalogRefused
from runtime.readiness.metrics import push_report, write_textfile
from runtime.readiness.plan import ReadinessSettings, plan_checks
from runtime.readiness.runner import run_checks
from runtime.readiness.transitions import offer_transition
from runtime.readiness.vault_login import worker_vault_token
from workflows.loader import RunbookInvalid, plan_run
from workflows.notices import event_sink
from workflows.readiness import READINESS_ACTIVITY, ReadinessRequest

__all__ = ["ScheduledReadiness"]


class ScheduledReadiness:
    def __init__(self, catalog: Catalog, registry: Registry) -> None:
        self._catalog = catalog
        self._registry = registry

    @activity.defn(name=READINESS_ACTIVITY)
    async def check(self, request: ReadinessRequest) -> dict[str, Any]:
        """The report as JSON; the metrics written on this host or pushed, as the request says."""
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
        try:
            checks = plan_checks(run, settings)
        except ValueError as exc:  # a target fact that is not valid (facts.rpo)
            raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from None
        async with worker_vault_token(run.target):
            report = await run_checks(run.runbook.metadata.name, run.target_name, checks)
        if request.metrics_file:
            write_textfile(report, Path(request.metrics_file))
        if request.push:
            push_report(report, request.push)
        # The worker's notifier (set with its runs' events) returns at once; none set, nothing is sent.
        offer_transition(report, command=f"coldstart readiness {held[0].path} --target {run.target_name}",
                         offer=event_sink())
        return report.as_json()
