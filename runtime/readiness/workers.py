"""Workers ready for the run: pollers on its task queues (Temporal DescribeTaskQueue) running this catalog's actions."""

from __future__ import annotations

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import PollerInfo, TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from runtime.readiness.model import Verdict, not_ready, ready

__all__ = ["describe_pollers", "workers_verdict"]


async def describe_pollers(client: Client, queue: str, kind: TaskQueueType.ValueType) -> list[PollerInfo]:
    reply = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind))
    return list(reply.pollers)


def _build(poller: PollerInfo) -> str:
    return poller.worker_version_capabilities.build_id or poller.deployment_options.build_id or "(none)"


def _contracts(poller: PollerInfo) -> str:
    """The actions' digest a poller reports: a Worker Deployment build id is `<package version>+<digest>`
    (runtime/deployment.py), an unversioned worker's the digest alone."""
    return _build(poller).rpartition("+")[2]


def _who(pollers: list[PollerInfo]) -> str:
    return ", ".join(sorted(f"{p.identity} ({_build(p)})" for p in pollers))


async def workers_verdict(client: Client, queue: str, build_id: str, *, workflows: bool = True) -> Verdict:
    """Ready when workers poll `queue` and every one of them reports `build_id`: the build id digests each
    action's contract (runtime/action_versions.py), so a worker missing an action, or running another
    version of one, reports another. workflows: the runs themselves are polled here too (not on a readings queue)."""
    activity = await describe_pollers(client, queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
    if not activity:
        return not_ready(f"no worker polls {queue} for actions")
    if workflows and not await describe_pollers(client, queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW):
        return not_ready(f"no worker polls {queue} for runs (workflow tasks); {len(activity)} poll for actions")
    other = [p for p in activity if _contracts(p) != build_id]
    if other:
        return not_ready(f"{len(other)} of {len(activity)} workers on {queue} run other actions than this "
                         f"catalog's {build_id}: {_who(other)}")
    many = len(activity) != 1
    return ready(f"{len(activity)} worker{'s' if many else ''} on {queue} run{'' if many else 's'} this catalog's "
                 f"actions ({build_id}): {', '.join(sorted(p.identity for p in activity))}")
