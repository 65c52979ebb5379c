"""The task queue the controller's workers poll and its clients start runs on, and the variable naming another."""

from __future__ import annotations

import os

__all__ = ["DEFAULT_TASK_QUEUE", "TASK_QUEUE_ENV", "task_queue"]

DEFAULT_TASK_QUEUE = "coldstart"
TASK_QUEUE_ENV = "COLDSTART_TASK_QUEUE"


def task_queue() -> str:
    return os.environ.get(TASK_QUEUE_ENV, DEFAULT_TASK_QUEUE)
