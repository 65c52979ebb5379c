"""The worker command, one definition for `python worker.py` and `coldstart worker`."""

from __future__ import annotations

import os
import sys

import typer

from activities.errors import InvalidInput
from runtime.eviction_watch import EXIT_STUCK
from runtime.queues import DEFAULT_TASK_QUEUE, DEPLOYMENT_ENV, TASK_QUEUE_ENV

__all__ = ["leave", "serve"]

JOURNAL_ENV = "COLDSTART_ACTION_JOURNAL"  # the action journal (activities/journal.py) a worker writes


def serve(
    ctx: typer.Context,
    task_queue: str = typer.Option(DEFAULT_TASK_QUEUE, envvar=TASK_QUEUE_ENV, help="the task queue to poll"),
    metrics: str = typer.Option("127.0.0.1:9464", envvar="COLDSTART_METRICS",
                                help="Prometheus metrics bind address, '' to disable"),
    journal: str | None = typer.Option(None, envvar=JOURNAL_ENV,
                                          help="append one JSON line per action attempt start/end to this file"),
    log_level: str = typer.Option("INFO", envvar="COLDSTART_LOG_LEVEL"),
    # A flag only, no environment variable: a worker runs starters' own runbooks only when started so on purpose.
    allow_development: bool = typer.Option(
        False, "--allow-development",
        help="targets marked development: true run the starter's own runbook file (local development only)"),
    deployment: str | None = typer.Option(
        None, envvar=DEPLOYMENT_ENV, help="the Worker Deployment this worker is a version of (default: the task queue)"),
    promote: bool = typer.Option(
        False, "--promote", help="make this worker's version the deployment's current one once it polls"),
    unversioned: bool = typer.Option(
        False, "--unversioned", help="poll without Worker Versioning (runs are not pinned to a build)"),
) -> None:
    """Run a worker: the runbook workflows and every registered action.

    It polls as a version of a Worker Deployment (the package version and its actions' digest), every run
    pinned to the version it started on. The first version of a deployment becomes current; a later one
    takes new runs once promoted (`--promote`, or `coldstart worker promote` when its runs may move)."""
    if ctx.invoked_subcommand is not None:
        return
    # The worker's imports (asyncio, Temporal, the actions, logging) stay off the CLI's start-up path.
    import asyncio

    from runtime.logs import configure_logging
    from runtime.sealing import SealKeys
    from runtime.worker import reading_settings, run_worker

    try:
        reading_settings()
        SealKeys.from_environment()
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging(log_level)
    try:
        clean = asyncio.run(run_worker(task_queue, metrics or None, journal or None, allow_development=allow_development,
                                       deployment=deployment, versioned=not unversioned, make_current=promote))
    except InvalidInput as exc:
        typer.echo(f"error: {exc}", err=True)
        leave(2)
        return
    leave(0 if clean else EXIT_STUCK)


def leave(code: int = 0) -> None:
    """Exit with `code` once a worker has stopped (the journal is written as it goes), logs flushed.

    Temporal's native core keeps threads that can hold the interpreter's finalization (a worker seen
    alive 30 s after SIGTERM with its Python done), so it leaves without finalizing, as the CLI does."""
    from runtime.logs import flush_logging

    flush_logging()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
