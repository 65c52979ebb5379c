"""A target's policy, held in the controller's inventory: who may start, approve and steer runs on it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from activities.retry import Duration

__all__ = ["OPERATOR_VERBS", "Blackout", "DrillCheck", "DrillSafety", "TargetIdentity", "TargetPolicy", "narrowed"]

_VERBS = Literal["start", "approve", "skip", "retry", "abort", "pause", "resume"]

# The controls that steer a whole run: who may is TargetPolicy.run_operators, and where the target verifies
# identity each needs a verified token, whatever `controls` lists.
OPERATOR_VERBS = ("retry", "pause", "resume", "abort")


class TargetIdentity(BaseModel):
    """Verified identity on a target: the Vault OIDC provider whose id tokens say who decides, and which
    decisions need one. A runbook's own `identity:` may add decisions to the list, never take any away."""

    model_config = ConfigDict(extra="forbid")

    vault: str = Field(pattern=r"^https?://", description="the Vault (https outside drills and development targets)")
    provider: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="identity/oidc/provider/<name>")
    audience: str = Field(min_length=1, description="the OIDC client's client_id, the tokens' aud claim")
    name_claim: str = "name"
    ca_cert: str | None = Field(default=None, description="the CA that signs the Vault's https certificate")
    controls: list[_VERBS] = Field(
        default_factory=lambda: ["start", "approve", "skip", "retry", "abort", "pause", "resume"],
        description="the decisions that need a verified token (every one, starting included, by default); retry, "
                    "pause, resume and abort need one on this target whether listed or not")


class DrillCheck(BaseModel):
    """A PromQL expression that is red while it returns a sample above 0; no series is not red (so
    `ALERTS{alertstate="firing", severity="page"}` blocks while a page fires)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=63)]
    query: str = Field(min_length=1)

    def red_count(self) -> str:
        """The query that counts the check's red series: one number, 0 when all is well (no series included)."""
        return f"count(({self.query}) > 0) or vector(0)"


class Blackout(BaseModel):
    """A change freeze: no drill starts between `start` and `end`."""

    model_config = ConfigDict(extra="forbid")

    start: AwareDatetime
    end: AwareDatetime
    reason: str = ""

    @model_validator(mode="after")
    def _ordered(self) -> Blackout:
        if self.end <= self.start:
            raise ValueError("a blackout ends after it starts")
        return self


class DrillSafety(BaseModel):
    """When a drill may not start on a target, and what stops one that runs."""

    model_config = ConfigDict(extra="forbid")

    prometheus: str | None = Field(default=None, pattern=r"^https?://",
                                   description="where the checks read; default: the target's telemetry.prometheus")
    blocking: list[DrillCheck] = Field(default_factory=list, description="a drill does not start while one is red")
    blackouts: list[Blackout] = Field(default_factory=list, description="the change-freeze calendar")
    guard: DrillCheck | None = Field(default=None, description="read while a drill runs: red, it stops and undoes")
    guard_interval: Duration = timedelta(seconds=30)

    def blackout_at(self, moment: datetime) -> Blackout | None:
        return next((b for b in self.blackouts if b.start <= moment < b.end), None)


class TargetPolicy(BaseModel):
    """Who may act on runs against a target. A runbook's own `approvers`, `operators` and `four_eyes` may
    narrow this, never widen it: the target's owners write it, not the runbook's authors or its starters."""

    model_config = ConfigDict(extra="forbid")

    starters: list[str] | None = Field(default=None, description="who may start runs; omitted: anyone who can reach Temporal")
    approvers: list[str] | None = Field(default=None, description="who may approve and skip; omitted: as the runbook says")
    operators: list[str] | None = Field(default=None, description="who may retry, pause, resume and abort (approvers "
                                                                  "too); omitted: as the runbook says, else its approvers")
    four_eyes: bool = Field(default=False, description="true: the starter never approves, and a skip needs two approvers")
    identity: TargetIdentity | None = Field(
        default=None, description="verified identity for decisions on this target; four eyes then compares "
                                  "verified subjects, the starter's included")
    drills: DrillSafety | None = Field(default=None, description="blocking checks, blackouts and a guard for drills")
    drill_approvers: list[str] = Field(
        default_factory=lambda: ["drill-bot"],
        description="the unattended drills' own approvers: refused for every decision on a run that is not a drill")

    @classmethod
    def of(cls, target: dict[str, Any]) -> TargetPolicy:
        """The policy in a target's inventory (as runbooks see it); none set: nothing restricted."""
        return cls.model_validate(target.get("policy") or {})

    def run_approvers(self, approvers: list[str]) -> list[str]:
        """A run's approvers (who may skip a held step): the runbook's `approvers` within the target's; nobody
        when neither names any."""
        return narrowed(self.approvers, list(approvers) or None) or []

    def run_operators(self, operators: list[str], approvers: list[str]) -> list[str]:
        """Who may retry, pause, resume and abort a run of a runbook naming `operators` and `approvers` here.

        Named operators, with the approvers: the target's (its `operators` and its `approvers`, the run's
        approvers where it leaves those to the runbook), narrowed by the runbook's. Where neither names an
        operator, the run's approvers alone; nobody when nobody is named. Never anyone who types a name: an
        abort ends a recovery, and a pause or a retry steers it."""
        if self.operators is None and not operators:
            return self.run_approvers(approvers)
        held = None
        if self.operators is not None or self.approvers is not None:
            held = sorted(set(self.operators or []) | set(self.approvers if self.approvers is not None else approvers))
        asked = sorted(set(operators) | set(approvers)) if operators else None
        return narrowed(held, asked) or []


def narrowed(held: list[str] | None, asked: list[str] | None) -> list[str] | None:
    """Who may act when the target holds `held` and the runbook asks for `asked` (None: not restricted there):
    the runbook narrows the target's list, never widens it."""
    if held is None:
        return None if asked is None else list(asked)
    if asked is None:
        return list(held)
    return [name for name in asked if name in held]
