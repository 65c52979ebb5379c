"""Contracts of the Consul leadership actions: the cluster's health as its servers see it, and moving the leader."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from activities.contracts.model import ContractModel
from activities.contracts.targets import ConsulTarget
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "HEALTH",
    "LEADER_TRANSFER",
    "HealthInput",
    "HealthOutput",
    "LeaderTransferInput",
    "LeaderTransferOutput",
    "ServerReport",
]


class HealthInput(ContractModel):
    consul: ConsulTarget
    metrics_format: Literal["prometheus", "json"] = Field(
        default="prometheus",
        description="prometheus gives true p50s (needs telemetry.prometheus_retention_time); "
                    "json reports go-metrics' interval mean instead")
    max_kv_apply_p50_ms: float = Field(default=300.0, gt=0, description="the postmortem's 'normal' bound")
    max_leader_contact_ms: float = Field(default=200.0, gt=0, description="autopilot's LastContactThreshold")


class ServerReport(ContractModel):
    """One server asked by consul.health: did it answer, and as whom."""

    url: str
    reachable: bool
    node: str | None = Field(default=None, description="its node name, when it answered")
    leader: bool = Field(default=False, description="it says it is the raft leader")
    error: str | None = Field(default=None, description="why it did not answer")


class HealthOutput(ContractModel):
    leader: str | None = Field(description="leader node name")
    leader_address: str | None
    leader_id: str | None
    voters: list[str]
    autopilot_healthy: bool
    failure_tolerance: int
    kv_apply_p50_ms: float | None = Field(description="None: no KV applies in the agent's 10 s window")
    leader_last_contact_ms: float | None
    metrics_node: str | None = Field(description="node whose /v1/agent/metrics was read")
    metrics_from_leader: bool
    metrics_format: str
    servers: list[ServerReport] = Field(description="every server asked, in the order given, answering or not")
    unreachable: list[str] = Field(description="URLs of the servers that did not answer")
    healthy: bool = Field(description="every server answered, leader known, autopilot healthy, p50 and contact "
                                      "within bounds")
    problems: list[str]


class LeaderTransferInput(ContractModel):
    consul: ConsulTarget
    slow_servers: list[str] = Field(min_length=1, description="node names or raft IDs of servers that must not lead")
    verify_timeout_seconds: float = Field(default=30.0, gt=0, le=600)


class LeaderTransferOutput(ContractModel):
    changed: bool
    previous_leader: str
    leader: str
    target: str | None
    reason: str


HEALTH = declare(
    "consul.health", HealthInput, HealthOutput, timeout=60, retry=Retry(max_attempts=3),
    doc="""Per server reachable or not; leader, voters, autopilot health, KV apply p50 and leader last contact.

    A server that does not answer is reported (with its error), not raised: during a recovery that is
    the case that matters. Cluster reads come from the servers that answer; only none answering fails.
    """,
)


LEADER_TRANSFER = declare(
    "consul.leader.transfer", LeaderTransferInput, LeaderTransferOutput, timeout=120, mutating=True, retry=Retry(max_attempts=4),
    doc="""Move raft leadership off servers marked slow to a healthy voter; nothing to do if the leader is not slow.""",
)
