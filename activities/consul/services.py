"""A non-essential Consul user as the inventory lists it: its tier, usage flag, Nomad job and health check."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from activities._fields import go_duration_seconds, kv_key

__all__ = ["UserService"]


class UserService(BaseModel):
    """One service from the inventory's tiers, and who owns the health check stretched while it is disabled.

    check_owner names where the check is defined, because that is the only place it can be changed
    and read back exactly:

    - "nomad": a check in a `service` block (provider consul) of Nomad job `nomad_job`, group
      `nomad_group`: the block named `check_service` (default: `name`), the check named `check_name`
      (default: the block's only check). It is changed in the job spec, in the same job version as
      the scale-down; a change made on the agent would be reset by Nomad's service sync.
    - "agent": a check registered directly on a Consul agent (`check_agent`, default consul.address)
      as `check_id`, whose full registration body is `check_definition`: the agent's own answer
      (GET /v1/agent/checks) carries neither the target nor the headers nor the method.
    - None: no check is changed.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    tier: str = ""
    essential: bool = False
    usage_flag_key: str | None = Field(default=None, description="KV key that turns the service's Consul usage on")
    nomad_job: str | None = Field(default=None, description="Nomad job running the service (scaled down)")
    nomad_group: str | None = Field(default=None, description="task group; default the job's only group")
    nomad_namespace: str = "default"
    check_owner: Literal["nomad", "agent"] | None = Field(
        default=None, description="who defines the check to stretch: nomad (the job's service block), agent "
                                  "(registered on an agent from check_definition), or none")
    check_service: str | None = Field(default=None, description="nomad: the service block's name; default name")
    check_name: str | None = Field(default=None, description="nomad: the check's name; default the block's only one")
    check_id: str | None = Field(default=None, description="agent: the check's ID on the agent")
    check_agent: str | None = Field(default=None, description="agent: the agent's URL; default consul.address")
    check_definition: dict[str, Any] | None = Field(
        default=None, description="agent: the check exactly as registered (PUT /v1/agent/check/register body "
                                  "without its ID), Interval included; what consul.user.enable puts back")

    @field_validator("usage_flag_key")
    @classmethod
    def _flag(cls, key: str | None) -> str | None:
        return None if key is None else kv_key(key)

    @model_validator(mode="after")
    def _owner(self) -> UserService:
        nomad_fields = [n for n in ("check_service", "check_name") if getattr(self, n) is not None]
        agent_fields = [n for n in ("check_id", "check_agent", "check_definition") if getattr(self, n) is not None]
        if self.check_owner != "nomad" and nomad_fields:
            raise ValueError(f"{nomad_fields} only apply with check_owner: nomad")
        if self.check_owner != "agent" and agent_fields:
            raise ValueError(f"{agent_fields} only apply with check_owner: agent")
        if self.check_owner == "nomad" and not self.nomad_job:
            raise ValueError("check_owner nomad needs nomad_job (the job whose service block defines the check)")
        if self.check_owner == "agent":
            if not (self.check_id and self.check_definition):
                raise ValueError("check_owner agent needs check_id and check_definition")
            if {k.lower() for k in self.check_definition} & {"id", "checkid"}:
                raise ValueError("check_definition carries no ID: give it as check_id")
            if _ci(self.check_definition, "TTL") or not _ci(self.check_definition, "Interval"):
                raise ValueError("check_definition needs an Interval (a TTL check has none to stretch)")
            go_duration_seconds(_ci(self.check_definition, "Interval"))
            if not _ci(self.check_definition, "Name"):
                raise ValueError("check_definition needs the check's Name (the agent requires one)")
        return self


def _ci(data: dict[str, Any], name: str) -> Any:
    want = name.lower().replace("_", "")
    return next((v for k, v in data.items() if k.lower().replace("_", "") == want), None)
