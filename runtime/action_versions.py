"""Each action's contract version, and the build id a worker reports so readiness can tell which catalog it runs."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from activities.registry import ActionSpec, Registry

__all__ = ["BUILD_ID_PREFIX", "action_version", "catalog_build_id"]

BUILD_ID_PREFIX = "actions-"


def _schema(model: Any) -> Any:
    return None if model is None else model.model_json_schema()


def action_version(spec: ActionSpec) -> str:
    """A digest of what a run relies on in the action: its input and output shapes, timeouts, retry and undo
    (not its reference text, which changes nothing a run does)."""
    contract = {
        "name": spec.name,
        "input": _schema(spec.input_model),
        "output": _schema(spec.output_model),
        "timeout": spec.timeout.total_seconds(),
        "heartbeat": spec.heartbeat.total_seconds() if spec.heartbeat else None,
        "retry": spec.retry,
        "mutating": spec.mutating,
        "undo": spec.undo,
        "undo_from_output": spec.undo_from_output,
    }
    text = json.dumps(contract, sort_keys=True, default=lambda v: v.model_dump(mode="json")
                      if hasattr(v, "model_dump") else str(v))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def catalog_build_id(registry: Registry) -> str:
    """`actions-<digest>` over every action's name and version: the Temporal build id a worker polls with, so
    DescribeTaskQueue shows whether the workers on a queue run the same actions as this catalog."""
    lines = "\n".join(f"{name} {action_version(spec)}" for name, spec in sorted(registry.specs.items()))
    return BUILD_ID_PREFIX + hashlib.sha256(lines.encode()).hexdigest()[:16]
