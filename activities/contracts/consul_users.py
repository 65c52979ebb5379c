"""Contracts of the Consul usage actions: disable non-essential services (flag, check, count) and restore them, one or many."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from activities._fields import go_duration_seconds, unique_names
from activities.consul.services import UserService
from activities.contracts.consul_kv import KvEntry
from activities.contracts.model import ContractModel
from activities.contracts.targets import ConsulTarget, NomadTarget
from activities.registry import declare

__all__ = [
    "JOURNAL_PREFIX",
    "USERS_DISABLE",
    "USERS_ENABLE",
    "USER_DISABLE",
    "USER_ENABLE",
    "AgentCheckRecord",
    "CheckPlace",
    "DisableKnobs",
    "FlagRecord",
    "NomadCheckRecord",
    "ScaleRecord",
    "ServiceRecord",
    "ServicesTarget",
    "UserDisableInput",
    "UserDisableOutput",
    "UserEnableInput",
    "UserEnableOutput",
    "UsersDisableInput",
    "UsersDisableOutput",
    "UsersEnableInput",
    "UsersEnableOutput",
]


class CheckPlace(ContractModel):
    """Where a check sits in a job spec."""

    group: str
    task: str | None = Field(default=None, description="None: a group-level service block")
    service: str = Field(description="the service block's name (the Consul service name)")
    check: str = Field(description="the check's name (Nomad names an unnamed check 'service: \"<svc>\" check')")


JOURNAL_PREFIX = "coldstart/journal/users/"


class FlagRecord(ContractModel):
    key: str
    previous: KvEntry | None = Field(description="None: the key did not exist")


class NomadCheckRecord(ContractModel):
    """A check as the Nomad job defined it before it was stretched."""

    owner: Literal["nomad"] = "nomad"
    job: str
    namespace: str
    place: CheckPlace
    interval: str = Field(description="the original interval, for humans (the definition holds it exactly)")
    definition: dict[str, Any] = Field(description="the check object exactly as the job spec had it")


class AgentCheckRecord(ContractModel):
    """A check registered on an agent, with the definition it is registered from."""

    owner: Literal["agent"] = "agent"
    agent: str
    check_id: str
    interval: str
    definition: dict[str, Any] = Field(description="the registration body from the inventory (without ID)")


class ScaleRecord(ContractModel):
    job: str
    group: str
    namespace: str
    count: int


class ServiceRecord(ContractModel):
    """What one service looked like before consul.user.disable touched it."""

    name: str
    tier: str = ""
    flag: FlagRecord | None = None
    check: Annotated[NomadCheckRecord | AgentCheckRecord, Field(discriminator="owner")] | None = None
    scale: ScaleRecord | None = None
    notes: list[str] = Field(default_factory=list)


class ServicesTarget(ContractModel):
    consul: ConsulTarget
    nomad: NomadTarget | None = Field(default=None, description="needed when services name a Nomad job")
    journal_prefix: str | None = Field(
        default=JOURNAL_PREFIX,
        description="KV prefix recording each service's original state before it is changed, so a crash or a "
                    "second disable never records the disabled state as the original; null = no journal")


class DisableKnobs(ContractModel):
    disabled_value: str = Field(default="disabled", description="what the usage flag is set to")
    check_interval: str = Field(default="10m", description="the stretched health-check interval")
    scale_to: int = Field(default=1, ge=0, description="task group count while disabled (never scales up)")

    @field_validator("check_interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        if go_duration_seconds(value) <= 0:
            raise ValueError("check_interval must be > 0")
        return value


class UserEnableInput(ServicesTarget):
    record: ServiceRecord
    tiers: list[str] | None = Field(default=None, description="only re-enable services of these tiers (the rest "
                                                             "are left for a later step); default every tier")


class UserDisableInput(ServicesTarget, DisableKnobs):
    service: UserService


class UserDisableOutput(ContractModel):
    service: str
    skipped: str | None = Field(default=None, description="why nothing was done (essential service)")
    changed: list[str] = Field(description="what this call changed: flag, check, scale")
    record: ServiceRecord | None
    restore: UserEnableInput = Field(description="the input for consul.user.enable (a no-op for essential services)")


class UserEnableOutput(ContractModel):
    service: str
    changed: list[str]
    notes: list[str] = Field(default_factory=list)


class UsersDisableInput(ServicesTarget, DisableKnobs):
    services: Annotated[list[UserService], unique_names("service")] = Field(min_length=1, max_length=20_000)
    max_parallel: int = Field(default=8, ge=1, le=64)


class UsersEnableInput(ServicesTarget):
    records: list[ServiceRecord] = Field(max_length=20_000)
    max_parallel: int = Field(default=8, ge=1, le=64)


class UsersDisableOutput(ContractModel):
    disabled: list[str] = Field(description="non-essential services now disabled")
    changed: dict[str, list[str]] = Field(description="per service, what this call changed (flag, check, scale); "
                                                      "services it changed nothing on are absent")
    skipped_essential: list[str]
    restore: UsersEnableInput


class UsersEnableOutput(ContractModel):
    enabled: list[str]
    changed: dict[str, list[str]] = Field(description="per service, what this call restored")


USER_DISABLE = declare(
    "consul.user.disable", UserDisableInput, UserDisableOutput, timeout=900, heartbeat=60, mutating=True, undo="consul.user.enable", undo_from_output="restore",
    doc="""Cut one non-essential service's Consul usage: flag off, health check every 10 min, job scaled down.

    The check is changed where its owner defines it (the Nomad job's service block, or the agent from
    the inventory's definition); the check and the count change in one job version. On a failure the
    error's details hold what changed and `restore`, the consul.user.enable input that undoes it.
    """,
)


USER_ENABLE = declare(
    "consul.user.enable", UserEnableInput, UserEnableOutput, timeout=900, heartbeat=60, mutating=True,
    doc="""Restore one service exactly as consul.user.disable recorded it (flag, every check field, job count).""",
)


USERS_DISABLE = declare(
    "consul.users.disable", UsersDisableInput, UsersDisableOutput, timeout=3 * 3600, heartbeat=120, mutating=True, undo="consul.users.enable", undo_from_output="restore",
    doc="""Disable every non-essential service's Consul usage; for 1,000s prefer for_each over consul.user.disable.

    Safe to retry: every service's original state is journaled in KV before it is changed. When some
    services fail, the error says per service what changed, and its details' `restore` brings back
    every service this call recorded, the failed ones' partial changes included.
    """,
)


USERS_ENABLE = declare(
    "consul.users.enable", UsersEnableInput, UsersEnableOutput, timeout=3 * 3600, heartbeat=120, mutating=True,
    doc="""Restore every recorded service exactly as consul.users.disable found it.""",
)
