"""Workers as a Temporal Worker Deployment version: a run finishes on the build it started on.

A recovery run lasts hours; its code must not change under it. `coldstart worker` polls as version
`<deployment>.<build id>` of a Worker Deployment, and every workflow type is PINNED (deployment_config): a
run, its fan-out batches and its fleet's members stay on the version that started the run, and only new
runs go to the deployment's current version. The build id is the package version and the actions'
contracts digest (runtime/action_versions.py), so a worker whose actions changed is a new version even
when the package version did not move.

The first version of a deployment becomes its current version when its worker starts (nothing else
could run the runs); after that a new version takes new runs only once promoted (`coldstart worker
promote`, or `temporal worker deployment set-current-version`), while the old version's workers stay up
until its runs have finished (`coldstart worker versions` shows them)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from activities.registry import Registry
from runtime.action_versions import catalog_build_id
from runtime.version import controller_version

__all__ = [
    "DeploymentVersionInfo",
    "VersionPlace",
    "current_build_id",
    "deployment_build_id",
    "deployment_config",
    "describe_versions",
    "promote",
    "take_place",
]


def deployment_build_id(registry: Registry) -> str:
    """`<package version>+actions-<digest>`: what a worker of this installation polls as."""
    return f"{controller_version()}+{catalog_build_id(registry)}"


def deployment_config(version: WorkerDeploymentVersion) -> WorkerDeploymentConfig:
    """Versioning on, every workflow type PINNED. Said here, not on the types: the server refuses a workflow task
    completed with a behavior by an unversioned worker (the tests' in-process workers, `--unversioned`)."""
    return WorkerDeploymentConfig(version=version, use_worker_versioning=True,
                                  default_versioning_behavior=VersioningBehavior.PINNED)


async def current_build_id(client: Client, name: str) -> str | None:
    """The deployment's current version's build id; None when it has none, or does not exist yet."""
    try:
        response = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name))
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    current = response.worker_deployment_info.routing_config.current_deployment_version
    return current.build_id or None


async def promote(client: Client, version: WorkerDeploymentVersion, *, identity: str,
                  within: float = 30.0) -> str | None:
    """Make `version` its deployment's current version; returns the build id that was current before.

    A worker's version is known to the server only once its pollers have reached it: until then (at most
    `within` seconds) the request is refused as not found, and asked again."""
    deadline = time.monotonic() + within
    while True:
        try:
            response = await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace, deployment_name=version.deployment_name,
                    build_id=version.build_id, identity=identity))
            return response.previous_deployment_version.build_id or None
        except RPCError as exc:
            retryable = exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION)
            if not retryable or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class VersionPlace:
    """Where a starting worker's version stands in its deployment."""

    current: bool
    # The build id new runs go to, when it is not this worker's.
    other: str | None = None
    previous: str | None = None

    def describe(self) -> str:
        if self.current:
            return "current" + (f" (was {self.previous})" if self.previous else "")
        return (f"not current: new runs start on {self.other}; this version finishes the runs pinned to it "
                "(`coldstart worker promote` makes it current)")


async def take_place(client: Client, version: WorkerDeploymentVersion, *, make_current: bool,
                     identity: str) -> VersionPlace:
    """On a worker's start: a deployment with no current version gets this one (nothing else could run its
    runs), `make_current` promotes it over another; otherwise the current version stays."""
    current = await current_build_id(client, version.deployment_name)
    if current == version.build_id:
        return VersionPlace(current=True)
    if current is None or make_current:
        previous = await promote(client, version, identity=identity)
        return VersionPlace(current=True, previous=previous)
    return VersionPlace(current=False, other=current)


@dataclass(frozen=True)
class DeploymentVersionInfo:
    build_id: str
    status: str
    current: bool


async def describe_versions(client: Client, name: str) -> list[DeploymentVersionInfo]:
    """The deployment's versions, newest first, each with its status (current, draining, drained...)."""
    from temporalio.api.enums.v1 import WorkerDeploymentVersionStatus

    response = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name))
    info = response.worker_deployment_info
    current = info.routing_config.current_deployment_version.build_id
    summaries = sorted(info.version_summaries, key=lambda s: s.create_time.ToDatetime(), reverse=True)
    return [DeploymentVersionInfo(
        build_id=s.deployment_version.build_id,
        status=WorkerDeploymentVersionStatus.Name(s.status).removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower(),
        current=s.deployment_version.build_id == current) for s in summaries]
