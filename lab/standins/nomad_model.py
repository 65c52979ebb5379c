"""Nomad stand-in vocabulary: API constants, NomadError and pure helpers shared by the state modules."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

__all__ = [
    "ACTIVE_DEPLOYMENT",
    "ALLOC_OMIT_EMPTY",
    "DEFAULT_UPDATE",
    "DEPLOYMENT_TYPES",
    "EVAL_OMIT_EMPTY",
    "NOMAD_VERSION",
    "NS_PER_S",
    "ByJob",
    "NomadError",
    "alloc_index",
    "by_id",
    "eval_view",
    "json_hash",
    "omit_empty",
    "public",
    "rfc3339",
    "task_state",
]

NS_PER_S = 1_000_000_000
NOMAD_VERSION = "1.1.6"
# The update block Nomad gives every group of a service or system job that names none (or only some fields):
# https://developer.hashicorp.com/nomad/docs/job-specification/update
DEFAULT_UPDATE = {
    "AutoPromote": False, "AutoRevert": False, "Canary": 0, "HealthCheck": "checks",
    "HealthyDeadline": 300 * NS_PER_S, "MaxParallel": 1, "MinHealthyTime": 10 * NS_PER_S,
    "ProgressDeadline": 600 * NS_PER_S, "Stagger": 30 * NS_PER_S,
}
DEPLOYMENT_TYPES = ("service", "system")
ACTIVE_DEPLOYMENT = ("initializing", "pending", "running", "paused", "blocked", "unblocking")


class ByJob(dict):
    """A table of allocations or deployments by ID that also finds a job's rows without a scan (a fan-out over
    1,000 jobs spent most of the stand-in's time scanning every allocation per request)."""

    def __init__(self, rows: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__()
        self._by_job: dict[tuple[str, str], dict[str, None]] = {}
        for key, row in (rows or {}).items():
            self[key] = row

    def __setitem__(self, key: str, row: dict[str, Any]) -> None:
        if key in self:
            self._drop(key)
        super().__setitem__(key, row)
        self._by_job.setdefault((row["Namespace"], row["JobID"]), {})[key] = None

    def __delitem__(self, key: str) -> None:
        self._drop(key)
        super().__delitem__(key)

    def _drop(self, key: str) -> None:
        row = self[key]
        self._by_job.get((row["Namespace"], row["JobID"]), {}).pop(key, None)

    def of(self, namespace: str, job_id: str) -> list[dict[str, Any]]:
        """The job's rows, in insertion order."""
        return [self[key] for key in self._by_job.get((namespace, job_id), ())]

    # Only the mutations above keep the index: refuse the ones that would bypass it.
    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("ByJob supports item assignment and deletion only")

    pop = popitem = clear = update = setdefault = _unsupported


class NomadError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def public(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop the stand-in's bookkeeping keys (prefixed _) from an API object."""
    return {k: v for k, v in obj.items() if not k.startswith("_")}


# Evaluation and Allocation fields Nomad's JSON omits when they are empty (zero, "", null, false).
EVAL_OMIT_EMPTY = ("AnnotatePlan", "BlockedEval", "ClassEligibility", "EscapedComputedClass", "FailedTGAllocs",
                   "NextEval", "NodeID", "NodeModifyIndex", "PreviousEval", "QuotaLimitReached", "RelatedEvals",
                   "StatusDescription", "Wait", "WaitUntil")
ALLOC_OMIT_EMPTY = ("DesiredDescription", "DesiredTransition", "FollowupEvalID", "NextAllocation",
                    "PreemptedAllocations", "PreemptedByAllocation", "PreviousAllocation", "RescheduleTracker")


def omit_empty(obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in obj.items()
            if k not in keys or (any(x is not None for x in v.values()) if isinstance(v, dict) else v)}


def eval_view(ev: dict[str, Any]) -> dict[str, Any]:
    return omit_empty(public(ev), EVAL_OMIT_EMPTY)


def by_id(table: dict[str, dict[str, Any]], key: str, what: str) -> dict[str, Any]:
    """An entry by its full ID or, as Nomad's API allows, a unique prefix of two characters or more."""
    entry = table.get(key)
    if entry is None:
        matches = [e for e in table.values() if e["ID"].startswith(key)] if len(key) >= 2 else []
        if len(matches) != 1:
            raise NomadError(404, f"{what} not found")
        entry = matches[0]
    return entry


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def json_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def alloc_index(alloc: dict[str, Any]) -> int:
    name = alloc["Name"]
    return int(name[name.rindex("[") + 1: -1])


# The TaskEvent fields every event carries, zero unless its type sets them.
TASK_EVENT_ZERO = {
    "RestartReason": "", "SetupError": "", "DriverError": "", "Signal": 0, "KillTimeout": 0, "KillError": "",
    "KillReason": "", "StartDelay": 0, "DownloadError": "", "ValidationError": "", "DiskLimit": 0,
    "FailedSibling": "", "VaultError": "", "TaskSignalReason": "", "TaskSignal": "", "DriverMessage": "",
    "GenericSource": "",
}


def task_state(state: str, now: int, event: str, message: str, failed: bool = False,
               started: Any = None, finished: Any = None, exit_code: int | None = None) -> dict[str, Any]:
    def stamp(v: Any) -> str | None:
        return rfc3339(v / NS_PER_S) if isinstance(v, int) else v

    return {
        "State": state, "Failed": failed, "Restarts": 0, "LastRestart": None, "Paused": "",
        "StartedAt": stamp(started), "FinishedAt": stamp(finished),
        "Events": [{**TASK_EVENT_ZERO, "Type": event, "Time": now, "DisplayMessage": message, "Message": message,
                    "ExitCode": exit_code or 0, "FailsTask": failed, "Details": {}}],
    }
