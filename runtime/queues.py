"""The task queue the controller's workers poll and its clients start runs on, the variable naming another, and
the Worker Deployment its workers are versions of (runtime/deployment.py)."""

from __future__ import annotations

import os
import re

__all__ = ["DEFAULT_TASK_QUEUE", "DEPLOYMENT_ENV", "TASK_QUEUE_ENV", "deployment_name", "task_queue"]

DEFAULT_TASK_QUEUE = "coldstart"
TASK_QUEUE_ENV = "COLDSTART_TASK_QUEUE"
DEPLOYMENT_ENV = "COLDSTART_DEPLOYMENT"
# A deployment version is named `<deployment>.<build id>` by the server: the name holds no dot.
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def task_queue() -> str:
    return os.environ.get(TASK_QUEUE_ENV, DEFAULT_TASK_QUEUE)


def deployment_name(queue: str | None = None) -> str:
    """$COLDSTART_DEPLOYMENT, else the task queue's name (one deployment per controller queue)."""
    return os.environ.get(DEPLOYMENT_ENV) or _NAME_UNSAFE.sub("-", queue or task_queue())
