"""Contracts of the session-store actions: cordon a host, release the sessions of its dead containers."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field, field_validator

from activities._fields import unique_names
from activities.contracts.consul_kv import KvSetInput
from activities.contracts.model import ContractModel
from activities.contracts.targets import ConsulTarget, HostTarget
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "CORDON",
    "RELEASE",
    "CordonInput",
    "CordonOutput",
    "ReleaseInput",
    "ReleaseOutput",
    "SessionStore",
]


def _prefix(value: str) -> str:
    if not value.endswith("/") or value.startswith("/") or any(c in value for c in "\n\r\0"):
        raise ValueError(f"store prefix {value!r} must end with '/' and not start with one")
    return value


class SessionStore(ContractModel):
    consul: ConsulTarget
    store_prefix: str = Field(default="sessions/", description="the session store's KV prefix")

    @field_validator("store_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return _prefix(value)


class CordonInput(SessionStore):
    host: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    reason: str = Field(default="", max_length=200)


class CordonOutput(ContractModel):
    key: str
    changed: bool
    undo: KvSetInput


class ReleaseInput(SessionStore):
    host: str = Field(min_length=1, max_length=64)
    hosts: Annotated[list[HostTarget], unique_names("host")] = Field(
        default_factory=list, description="the container hosts (to verify which containers are gone)")
    cgroup_parent: str = Field(default="", max_length=200)
    assume_host_dead: bool = Field(
        default=False, description="the host is gone (past its preemption deadline): all its containers are dead")
    require_all: bool = Field(default=True, description="fail when entries remain for live containers")


class ReleaseOutput(ContractModel):
    host: str
    released: list[str] = Field(description="repls whose entry pointed at a dead container and was deleted")
    released_count: int = 0
    kept_live: list[str] = Field(description="repls whose container on this host still runs")
    moved: list[str] = Field(description="repls re-pointed elsewhere meanwhile: left alone")
    seconds: float
    finished_at: float = Field(description="unix time when the store was left as reported: gates read fresher samples")


CORDON = declare(
    "sessions.cordon", CordonInput, CordonOutput, timeout=10, mutating=True, undo="consul.kv.set", undo_from_output="undo", retry=Retry(max_attempts=5, initial_interval=timedelta(seconds=0.2)),
    doc="""Mark a host unschedulable in the session store, so no new container is placed on it (idempotent).""",
)


RELEASE = declare(
    "sessions.release", ReleaseInput, ReleaseOutput, timeout=60, heartbeat=10, mutating=True, retry=Retry(max_attempts=5, initial_interval=timedelta(seconds=0.2)),
    doc="""Delete, in transactions of delete-cas, every entry of `host` whose container is verified gone.

    Idempotent: a second run finds nothing of the host's left. An entry re-pointed elsewhere in the
    meantime fails its check-and-set and is left alone (reported as moved).
    """,
)
