"""Contracts of the Nomad actions: scale a task group, quarantine unhealthy nodes, redeploy a job from scratch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from activities.contracts.model import ContractModel
from activities.contracts.targets import NomadTarget
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "JOBS_SCALE",
    "JOB_REDEPLOY_FROM_SCRATCH",
    "NODES_QUARANTINE_UNHEALTHY",
    "NODES_RESTORE_ELIGIBILITY",
    "AllocView",
    "NodeProbe",
    "NodeVerdict",
    "NodesEligibleInput",
    "NodesEligibleOutput",
    "QuarantineInput",
    "QuarantineOutput",
    "RedeployInput",
    "RedeployOutput",
    "ScaleInput",
    "ScaleOutput",
]


class ScaleInput(ContractModel):
    nomad: NomadTarget
    job: str = Field(min_length=1)
    group: str | None = Field(default=None, description="task group; default the job's only group")
    count: int = Field(ge=0, le=100_000)
    namespace: str = "default"
    message: str = "coldstart: scaled by runbook"


class ScaleOutput(ContractModel):
    job: str
    group: str
    previous_count: int
    count: int
    changed: bool
    undo: ScaleInput


class NodeProbe(ContractModel):
    """An HTTP probe for one node (by name or ID): anything but an expected status is a failure."""

    node: str
    url: str = Field(pattern=r"^https?://")
    expect_status: list[int] = Field(default_factory=lambda: [200])
    timeout_seconds: float = Field(default=5.0, gt=0, le=60)


class QuarantineInput(ContractModel):
    nomad: NomadTarget
    probes: list[NodeProbe] = Field(default_factory=list)
    failed_allocs_within_minutes: float | None = Field(
        default=None, gt=0, description="also fail a node with allocations failed within this window")
    min_failed_allocs: int = Field(default=1, ge=1)
    max_fraction: float = Field(default=0.5, gt=0, le=1, description="refuse (change nothing) when more than this "
                                "share of eligible ready nodes would be quarantined: a broken probe looks like this")


class NodeVerdict(ContractModel):
    node_id: str
    name: str
    reasons: list[str]


class NodesEligibleInput(ContractModel):
    nomad: NomadTarget
    node_ids: list[str] = Field(default_factory=list)


class QuarantineOutput(ContractModel):
    quarantined: list[NodeVerdict] = Field(description="nodes this call made ineligible")
    healthy: list[str]
    skipped: list[str] = Field(description="nodes not ready or already ineligible: not probed")
    undo: NodesEligibleInput


class NodesEligibleOutput(ContractModel):
    made_eligible: list[str]
    unchanged: list[str]


class RedeployInput(ContractModel):
    nomad: NomadTarget
    job: str = Field(min_length=1)
    namespace: str = "default"
    job_spec: dict[str, Any] | None = Field(
        default=None, description="the job as JSON (the API's Job object); default: the running job's spec, "
                                  "read and recorded before the purge")
    deadline_seconds: float = Field(default=900, gt=0, le=6 * 3600)
    poll_seconds: float = Field(default=2.0, gt=0, le=60)
    stop_timeout_seconds: float = Field(default=120, gt=0, le=3600)
    port_label: str | None = Field(default=None, description="also return each healthy allocation's address for "
                                                             "this port label as ip:port (output endpoints)")

    @field_validator("job_spec")
    @classmethod
    def _spec(cls, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        if spec is None:
            return None
        job: dict[str, Any] = spec.get("Job", spec)
        if not job.get("TaskGroups"):
            raise ValueError("job_spec has no TaskGroups")
        return job


class AllocView(ContractModel):
    id: str
    node: str
    group: str
    status: str
    ports: dict[str, str] = Field(default_factory=dict, description="port label -> host ip:port")


class RedeployOutput(ContractModel):
    job: str
    spec_source: Literal["inline", "recorded"]
    purged: bool
    job_modify_index: int
    allocations: list[AllocView]
    expected: int
    stop_seconds: float
    deploy_seconds: float
    failed_allocations: list[AllocView] = Field(default_factory=list)
    endpoints: list[str] = Field(default_factory=list, description="ip:port of port_label on each healthy allocation")


JOBS_SCALE = declare(
    "nomad.jobs.scale", ScaleInput, ScaleOutput, timeout=900, heartbeat=60, mutating=True, undo="nomad.jobs.scale", undo_from_output="undo",
    doc="""Set a task group's count (modify index enforced, an active deployment waited out); the undo puts it back.""",
)


NODES_QUARANTINE_UNHEALTHY = declare(
    "nomad.nodes.quarantine_unhealthy", QuarantineInput, QuarantineOutput, timeout=300, mutating=True, undo="nomad.nodes.restore_eligibility", undo_from_output="undo", retry=Retry(max_attempts=3),
    doc="""Make ineligible every ready, eligible node that fails its probe (HTTP or recent failed allocations).""",
)


NODES_RESTORE_ELIGIBILITY = declare(
    "nomad.nodes.restore_eligibility", NodesEligibleInput, NodesEligibleOutput, timeout=120, mutating=True,
    doc="""Mark the given nodes eligible again (the undo of nomad.nodes.quarantine_unhealthy).""",
)


JOB_REDEPLOY_FROM_SCRATCH = declare(
    "nomad.job.redeploy_from_scratch", RedeployInput, RedeployOutput, timeout=6 * 3600, heartbeat=60, mutating=True, retry=Retry(max_attempts=3),
    doc="""Stop a job, wait for its tasks to end, purge it, register it again and wait until its deployment is healthy.

    For caches that must come up from a standing start: the old allocations, reschedule trackers and
    deployments go with the purge, and no old task (one ignoring its kill signal runs until its
    kill_timeout) is left beside a new one. Progress is heartbeated (phase, recorded spec, register
    index) and a retried attempt resumes there, so a crash after the purge still registers the
    recorded spec. A fresh registration places every allocation directly: Nomad only uses canaries
    when updating an existing job, so there are none to promote here.
    """,
)
