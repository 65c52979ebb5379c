"""`coldstart worker`: run a worker; `promote` and `versions` steer its Worker Deployment (runtime/deployment.py)."""

from __future__ import annotations

import typer

from runtime.queues import DEFAULT_TASK_QUEUE, DEPLOYMENT_ENV, TASK_QUEUE_ENV
from runtime.serve import serve

__all__ = ["worker_app"]

worker_app = typer.Typer(add_completion=False)
# `coldstart worker [OPTIONS]` runs the worker as it always did; its subcommands steer the deployment.
worker_app.callback(invoke_without_command=True)(serve)

_QUEUE = typer.Option(DEFAULT_TASK_QUEUE, envvar=TASK_QUEUE_ENV, help="the workers' task queue")
_DEPLOYMENT = typer.Option(None, envvar=DEPLOYMENT_ENV, help="the Worker Deployment (default: the task queue)")
EXIT_UNREACHABLE = 4


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@worker_app.command("promote")
def promote_command(
    build_id: str | None = typer.Option(None, "--build-id", help="the version to make current (default: this "
                                                                 "installation's, as its worker polls)"),
    task_queue: str = _QUEUE,
    deployment: str | None = _DEPLOYMENT,
    within: float = typer.Option(30.0, help="seconds to wait for the version's workers to reach the server"),
) -> None:
    """Make a version current: new runs start on it; runs in flight finish on the version they started on."""
    import asyncio
    import getpass

    from temporalio.common import WorkerDeploymentVersion
    from temporalio.service import RPCError

    from activities.catalog import load_registry
    from runtime.connection import connect
    from runtime.deployment import deployment_build_id, promote
    from runtime.queues import deployment_name

    name = deployment or deployment_name(task_queue)
    version = WorkerDeploymentVersion(name, build_id or deployment_build_id(load_registry()))

    async def go() -> str | None:
        client = await connect()
        return await promote(client, version, identity=f"{getpass.getuser()} (coldstart worker promote)",
                             within=within)

    try:
        previous = asyncio.run(go())
    except RPCError as exc:
        _fail(f"{name}: {version.build_id} not made current: {exc.message} (is a worker of it running? "
              f"`coldstart worker versions` lists the deployment's versions)", 1)
        return
    except OSError as exc:
        _fail(f"Temporal unreachable: {exc}", EXIT_UNREACHABLE)
        return
    if previous == version.build_id:
        typer.echo(f"{name}: {version.build_id} was already current")
        return
    typer.echo(f"{name}: {version.build_id} is current" + (f" (was {previous})" if previous else "")
               + "; runs in flight finish on the version they started on")


@worker_app.command("versions")
def versions_command(task_queue: str = _QUEUE, deployment: str | None = _DEPLOYMENT) -> None:
    """The deployment's versions, newest first: which is current, which still finish runs (draining)."""
    import asyncio

    from temporalio.service import RPCError, RPCStatusCode

    from runtime.connection import connect
    from runtime.deployment import describe_versions
    from runtime.queues import deployment_name

    name = deployment or deployment_name(task_queue)

    async def go():
        return await describe_versions(await connect(), name)

    try:
        found = asyncio.run(go())
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            _fail(f"no Worker Deployment {name!r}: no versioned worker has polled {task_queue}", 1)
        _fail(f"{name}: {exc.message}", 1)
        return
    for version in found:
        typer.echo(f"{'*' if version.current else ' '} {version.build_id}  {version.status}")
