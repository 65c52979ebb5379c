"""Contracts of the container actions: list a host's containers, kill their inits at once, confirm a preemption notice."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from pydantic import Field, model_validator

from activities._fields import unique_names
from activities.contracts.model import ContractModel
from activities.contracts.targets import HostTarget
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "KILL_INITS",
    "LIST_CONTAINERS",
    "PREEMPTION_NOTICE",
    "ContainerState",
    "HostCgroup",
    "HostContainers",
    "KillInitsInput",
    "KillInitsOutput",
    "ListInput",
    "NamedHost",
    "NoticeInput",
    "NoticeOutput",
]


class NamedHost(ContractModel):
    """One host of a group (`${{ target.groups.container_hosts }}`) chosen by name."""

    host: str = Field(min_length=1, max_length=64)
    hosts: Annotated[list[HostTarget], unique_names("host")] = Field(min_length=1)

    @model_validator(mode="after")
    def _known_host(self) -> NamedHost:
        if self.host not in {h.name for h in self.hosts}:
            raise ValueError(f"host {self.host!r} is not one of {sorted(h.name for h in self.hosts)}")
        return self

    def target(self) -> HostTarget:
        return next(h for h in self.hosts if h.name == self.host)


class HostCgroup(NamedHost):
    """A host and its containers' cgroup."""

    cgroup_parent: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*$", max_length=200,
                               description="the cgroup holding one child group per container, below the hierarchy root")


class ListInput(HostCgroup):
    pass


class ContainerState(ContractModel):
    name: str
    processes: int
    inits: list[int] = Field(description="host PIDs of the container's PID-namespace init")


class HostContainers(ContractModel):
    host: str
    cgroup: str
    containers: list[ContainerState]

    @property
    def alive(self) -> list[str]:
        return [c.name for c in self.containers if c.processes]


class KillInitsInput(HostCgroup):
    verify_within_seconds: float = Field(default=5.0, gt=0, le=60,
                                         description="how long the killed containers may take to be empty")


class KillInitsOutput(ContractModel):
    host: str
    cgroup: str = Field(description="where the containers were looked for (none there: nothing to kill)")
    killed: list[str] = Field(description="containers whose init got SIGKILL in this attempt")
    killed_count: int = 0
    already_gone: list[str] = Field(description="containers with no process left before this attempt")
    seconds: float = Field(description="from the first signal until every container was empty (the kernel has reclaimed them)")
    signalled_seconds: float = Field(0.0, description="from the first signal to the last: every container's processes "
                                     "are dead to user space from then on")
    realtime: bool = Field(False, description="the signals were sent at real-time priority (not preempted by the dying), "
                           "and each init was raised to it just before its signal")
    reapers: int = Field(0, description="the inits' parents (the runtime's shims, which reap them) raised to real-time "
                         "priority until the cgroups were empty, then put back to their own policy")
    reapers_kept_realtime: list[int] = Field(default_factory=list, description="PIDs of parents still alive that could "
                                             "not be put back (none unless the host refused it)")


class NoticeInput(NamedHost):
    metadata_urls: dict[str, Annotated[str, Field(pattern=r"^https?://[^\s]+$", max_length=300)]] = Field(
        description="per host, the provider's spot/instance-action metadata URL as the host itself reaches it")
    deadline: str = Field(max_length=40, description="the deadline the run was started with: unix seconds or RFC 3339")
    tolerance_seconds: float = Field(default=5.0, ge=0, le=600,
                                     description="how far the host's own notice may be from that deadline")


class NoticeOutput(ContractModel):
    host: str
    action: str
    terminates_at: datetime
    off_by_seconds: float = Field(description="the host's notice less the deadline the run was given")


PREEMPTION_NOTICE = declare(
    "containers.preemption_notice", NoticeInput, NoticeOutput, timeout=30, heartbeat=10, retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=0.5)),
    doc="""Confirm from the host itself that the provider will terminate it, at about the deadline the run was
    given: a run started by an alert drains nothing on the alert's word alone.""",
)


LIST_CONTAINERS = declare(
    "containers.list", ListInput, HostContainers, timeout=30, heartbeat=10, retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=0.2)),
    doc="""Every container on a host (a child cgroup of the parent), its process count and its namespace init.""",
)


KILL_INITS = declare(
    "containers.kill_inits", KillInitsInput, KillInitsOutput, timeout=30, heartbeat=10, mutating=True, retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=0.2)),
    doc="""SIGKILL every container's PID-namespace init on a host at once, then verify every container is empty.

    Idempotent: containers already empty are reported as already gone. Fails (retryable) naming
    the containers that still have processes, after saying which inits it killed.
    """,
)
