"""`coldstart readiness`: a runbook's recovery path checked now, as a table or JSON, exported as metrics."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from temporalio.client import Client
from temporalio.envconfig import ClientConfig

from activities.catalog import load_contracts
from activities.retry import format_duration
from runtime import notifications
from runtime.action_versions import catalog_build_id
from runtime.readiness import ReadinessSettings, Report, plan_checks, push_report, run_checks, write_textfile
from runtime.readiness.transitions import offer_transition
from runtime.readiness.vault_login import worker_vault_token
from workflows.contract import RunInput

__all__ = ["frontend_address", "readiness_report", "render_report", "settings_for"]

_STYLE = {"ready": "green", "not_ready": "red", "unknown": "yellow"}
_WORD = {"ready": "ready", "not_ready": "NOT READY", "unknown": "unknown"}


def frontend_address() -> str:
    """The Temporal frontend the CLI and the workers dial (envconfig profile, TEMPORAL_ADDRESS)."""
    config = ClientConfig.load_client_connect_config(profile=os.environ.get("TEMPORAL_PROFILE"))
    return str(config.get("target_host") or "localhost:7233")


def settings_for(task_queue: str, *, timeout: float, temporal_config: Path | None = None,
                 trial_restore: bool = False) -> ReadinessSettings:
    from runtime.connection import connect

    async def connected() -> Client:
        return await connect()

    return ReadinessSettings(connect=connected, frontend=frontend_address(), task_queue=task_queue,
                             build_id=catalog_build_id(load_contracts()), timeout=timeout,
                             temporal_config=temporal_config.read_text() if temporal_config else "",
                             trial_restore=trial_restore)


async def readiness_report(run: RunInput, settings: ReadinessSettings, *, metrics_file: Path | None = None,
                           push: str | None = None, command: str = "") -> Report:
    """Run every check the planned run needs; write or push the metrics when asked; when readiness turned red
    (or ready again) since the last check, tell $COLDSTART_NOTIFY's sinks, waiting at most 5 s for them."""
    async with worker_vault_token(run.target) as login:
        report = await run_checks(run.runbook.metadata.name, run.target_name,
                                  plan_checks(run, replace(settings, vault=login)))
    if metrics_file:
        write_textfile(report, metrics_file)
    if push:
        push_report(report, push)
    notifier = notifications.from_environment()
    offer_transition(report, command=command or f"coldstart readiness --target {run.target_name}",
                     offer=notifier.offer if notifier else None)
    if notifier is not None:
        await asyncio.to_thread(notifier.close, 5.0)
    return report


def render_report(console: Console, report: Report) -> None:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=f"readiness of {report.runbook} on {report.target}",
                  title_justify="left")
    # A check's name is its metric label: folded on a narrow terminal, never cut short.
    table.add_column("check", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("evidence", overflow="fold")
    table.add_column("took", no_wrap=True)
    for result in report.results:
        table.add_row(result.check, Text(_WORD[result.state], style=_STYLE[result.state]),
                      Text(result.evidence), format_duration(round(result.seconds, 3)))
    console.print(table)
    counts = {state: sum(r.state == state for r in report.results) for state in _WORD}
    console.print(Text(f"{_WORD[report.state]}: {counts['ready']} ready, {counts['not_ready']} not ready, "
                       f"{counts['unknown']} unknown", style=_STYLE[report.state]))

