"""Contracts of the Consul agent actions: streaming on or off in each agent's own configuration, and its undo."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field

from activities._fields import unique_names
from activities.consul.agent_hosts import DROP_IN, ConsulAgentHost, Role, StreamingReport
from activities.contracts.model import ContractModel
from activities.contracts.targets import ConsulTarget
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "AGENTS_STREAMING",
    "AGENTS_STREAMING_RESTORE",
    "AGENTS_STREAMING_STATUS",
    "AgentChange",
    "AgentRestore",
    "AgentStatus",
    "AgentWaves",
    "AgentsStreamingInput",
    "AgentsStreamingOutput",
    "AgentsStreamingRestoreInput",
    "AgentsStreamingRestoreOutput",
    "AgentsStreamingStatusInput",
    "AgentsStreamingStatusOutput",
]

# The drop-in is joined to the agent's config_dir: a plain file name keeps every write inside that directory.
DROP_IN_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}\.json$"


class AgentWaves(ContractModel):
    wave_size: int = Field(default=5, ge=1, le=100, description="client agents restarted at once (servers: one)")
    ready_timeout_seconds: float = Field(default=60.0, gt=0, le=3600,
                                         description="how long a restarted agent has to answer with the setting")


class AgentsStreamingInput(AgentWaves):
    """Streaming on or off in each agent's own configuration (client agents' use_streaming_backend, servers'
    rpc.enable_streaming too), applied by restarting the agents in waves and read back from each agent."""

    consul: ConsulTarget = Field(description="the cluster, for its ACL token (agent:read on every agent)")
    agents: Annotated[list[ConsulAgentHost], unique_names("agent")] = Field(min_length=1, max_length=10_000)
    enabled: bool
    roles: list[Role] = Field(default_factory=lambda: ["client"], min_length=1,
                              description="which agents change: servers are restarted one at a time")
    file: str = Field(default=DROP_IN, pattern=DROP_IN_NAME, description="the drop-in's name in each config directory")


class AgentChange(ContractModel):
    agent: str
    role: Role
    changed: bool
    file_written: bool
    restarted: bool
    before: StreamingReport
    after: StreamingReport


class AgentRestore(ContractModel):
    """One agent as the change found it: its drop-in (None: absent) and what it reported."""

    agent: ConsulAgentHost
    file: str = Field(pattern=DROP_IN_NAME, description="the drop-in's name in the agent's config directory")
    previous: str | None
    written: str = Field(description="the drop-in the change left; the undo refuses if it is no longer there")
    report: StreamingReport


class AgentsStreamingRestoreInput(AgentWaves):
    """Put each agent's drop-in back as it was and restart the agents whose setting differs from before."""

    consul: ConsulTarget
    agents: list[AgentRestore] = Field(max_length=10_000)


class AgentsStreamingOutput(ContractModel):
    enabled: bool
    agents: list[AgentChange]
    changed_agents: list[str]
    skipped_agents: list[str] = Field(description="agents of a role not selected; left alone")
    undo: AgentsStreamingRestoreInput


class AgentsStreamingRestoreOutput(ContractModel):
    agents: list[AgentChange]
    changed_agents: list[str]


class AgentsStreamingStatusInput(ContractModel):
    """Read each agent's effective streaming setting from its own API; with `expect`, fail unless all report it."""

    consul: ConsulTarget
    agents: Annotated[list[ConsulAgentHost], unique_names("agent")] = Field(min_length=1, max_length=10_000)
    roles: list[Role] = Field(default_factory=lambda: ["client"], min_length=1)
    expect: bool | None = Field(default=None, description="the setting every selected agent must report")
    max_parallel: int = Field(default=16, ge=1, le=256)


class AgentStatus(ContractModel):
    agent: str
    role: Role
    report: StreamingReport | None = None
    error: str | None = None


class AgentsStreamingStatusOutput(ContractModel):
    agents: list[AgentStatus]
    streaming_on: list[str]
    streaming_off: list[str]


AGENTS_STREAMING = declare(
    "consul.agents.streaming", AgentsStreamingInput, AgentsStreamingOutput, timeout=3600, heartbeat=60, mutating=True, undo="consul.agents.streaming_restore", undo_from_output="undo",
    doc="""Turn Consul streaming on or off where it lives: each agent's own configuration.

    For each selected agent, through its host's shell: a drop-in in its config directory
    (`use_streaming_backend`, and on servers `rpc.enable_streaming`), a restart, and a read-back
    of the agent's effective setting from its own /v1/agent/self. An agent already reporting the
    setting is left alone. Turning off goes clients first, then servers; turning on the reverse.
    Clients restart `wave_size` at a time, servers one at a time; a failed wave stops the rest.
    """,
)


AGENTS_STREAMING_RESTORE = declare(
    "consul.agents.streaming_restore", AgentsStreamingRestoreInput, AgentsStreamingRestoreOutput, timeout=3600, heartbeat=60, mutating=True,
    doc="""The undo of consul.agents.streaming: each agent's drop-in back as it was (or gone), restarted where its
    reported setting differs from what it reported before, and read back from the agent.

    Refuses before changing anything when a drop-in is neither what the change wrote nor what was
    there before (someone changed it since).
    """,
)


AGENTS_STREAMING_STATUS = declare(
    "consul.agents.streaming_status", AgentsStreamingStatusInput, AgentsStreamingStatusOutput, timeout=300,
    retry=Retry(max_attempts=10, initial_interval=timedelta(seconds=2)),
    doc="""Each selected agent's effective streaming setting, as its own /v1/agent/self reports it.

    With `expect`, an agent that reports otherwise or does not answer fails the step (retried a few
    times, as a restarted agent may still be coming up): a check that the setting holds everywhere.
    """,
)
