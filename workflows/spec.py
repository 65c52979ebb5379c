"""The runbook language: pydantic models that are both the YAML contract and the workflow input."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

from pydantic import (
    AwareDatetime,
    BaseModel,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from activities.retry import Duration, Retry
from activities.strict import StrictModel

__all__ = [
    "STEP_KINDS",
    "STEP_TYPES",
    "ActionDefaults",
    "ActionStep",
    "AdaptiveSpec",
    "AnyStep",
    "ApprovalSpec",
    "ApprovalStep",
    "Comparator",
    "DeadlineSpec",
    "Finite",
    "ForEachSpec",
    "ForEachStep",
    "GateSpec",
    "GateStep",
    "IdentityPolicy",
    "Metadata",
    "Objectives",
    "OnFailure",
    "ParallelStep",
    "Param",
    "PhaseObjective",
    "RampSpec",
    "RampStep",
    "Runbook",
    "Step",
    "UndoSpec",
    "WaitStep",
    "step_kind",
]

StepId = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=63)]
# A number a gate or a ramp compares with: NaN compares false with everything (a `<` gate never passes, a `!=`
# gate always does) and an infinity is no bound, so both are refused where they are written.
Finite = Annotated[float, Field(allow_inf_nan=False)]


class Metadata(StrictModel):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*$", max_length=63)]
    description: str = ""
    owner: str = ""


class Param(StrictModel):
    type: Literal["string", "integer", "number", "boolean", "duration", "list", "object"] = "string"
    default: Any = None
    description: str = ""
    # Resolved before the run starts: a target reference becomes what it names (a list, or a mapping).
    one_of: list[Any] | dict[str, Any] | Annotated[str, Field(pattern=r"^\s*\$\{\{\s*target\.[^}]*\}\}\s*$")] | None = Field(
        default=None,
        description="the values allowed: a list, or a reference into the target (${{ target.groups.container_hosts }}: "
                    "the names of its entries, or a mapping's keys), so a starter cannot name what the inventory lacks",
    )


class OnFailure(StrEnum):
    abort = "abort"
    hold = "hold"
    rollback = "rollback"
    retry = "retry"


class UndoSpec(StrictModel):
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")


class _StepBase(StrictModel):
    id: StepId
    name: str = ""
    description: str = ""
    on_failure: OnFailure = OnFailure.abort
    retry: Retry | None = None
    # Time limits: the step must end within `deadline` of the run's start (and before the runbook's
    # deadline), and is not started when less than `needs` is left: it fails fast instead.
    deadline: Duration | None = None
    needs: Duration | None = None

    @property
    def kind(self) -> str:
        """action, gate, approval, wait, ramp, for_each or parallel (STEP_TYPES below)."""
        return _KIND_OF[type(self)]


class ActionStep(_StepBase):
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    undo: UndoSpec | None = None
    timeout: Duration | None = None


Comparator = Literal["<", "<=", ">", ">=", "==", "!="]


class GateSpec(StrictModel):
    name: str = ""
    source: Literal["prometheus", "http"] = "prometheus"
    # Prometheus base URL, or the URL probed for source http; usually ${{ target.telemetry.prometheus }}.
    endpoint: str
    query: str = ""
    comparator: Comparator
    threshold: Finite
    interval: Duration = timedelta(seconds=10)
    consecutive: Annotated[int, Field(ge=1, le=1000)] = 1
    bake: Duration | None = None
    timeout: Duration = timedelta(minutes=5)

    @model_validator(mode="after")
    def _query_for_prometheus(self) -> GateSpec:
        if self.source == "prometheus" and not self.query.strip():
            raise ValueError("a prometheus gate needs a query")
        if self.interval <= timedelta(0):
            raise ValueError("interval must be positive")
        return self


class GateStep(_StepBase):
    gate: GateSpec


class ApprovalSpec(StrictModel):
    approvers: list[str] | None = None
    four_eyes: bool | None = None
    prompt: str = ""
    timeout: Duration | None = None


class ApprovalStep(_StepBase):
    approval: ApprovalSpec


class WaitStep(_StepBase):
    wait: Duration


class AdaptiveSpec(StrictModel):
    """Opt-in: each next step from the gates' headroom (workflows/ramp_policy.py): the step grows by `increase`
    while every gate keeps at least twice `headroom` (a share of its threshold, trend included), shrinks by
    `backoff` when one has less than `headroom`, and stays between `min_step` and `max_step`. While that gate
    is still moving toward its threshold, the ramp holds where it is and reads again after a bake, up to
    `max_holds` times in a row. A gate's move over a bake is projected `lookahead` bakes ahead. A failed gate
    steps back to the last good percentage, shrinks the step and tries again, up to `max_backoffs` times."""

    min_step: Annotated[int, Field(ge=1, le=100)] = 5
    max_step: Annotated[int, Field(ge=1, le=100)] = 30
    increase: Annotated[int, Field(ge=1, le=100)] = 10
    backoff: Annotated[Finite, Field(ge=0.1, le=0.9)] = 0.5
    headroom: Annotated[Finite, Field(gt=0, le=1)] = 0.2
    max_rate: Annotated[Finite, Field(gt=0)] | None = Field(
        default=None, description="a boot-rate limit: at most this many percentage points a minute")
    max_backoffs: Annotated[int, Field(ge=0, le=20)] = 3
    max_holds: Annotated[int, Field(ge=0, le=100)] = 10
    # Two: the next percentage's bake, and one more because what a gate reads trails what happened (a scrape,
    # a rule's evaluation, a rate over a window): a cache emptied during a bake has shown only its first misses.
    lookahead: Annotated[Finite, Field(ge=1, le=10)] = Field(
        default=2.0, description="how many bakes ahead a gate's move over the last bake is projected")

    @model_validator(mode="after")
    def _bounds(self) -> AdaptiveSpec:
        if self.min_step > self.max_step:
            raise ValueError("min_step is above max_step")
        return self


class RampSpec(StrictModel):
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    start: Annotated[int, Field(ge=0, le=100)] = 10
    stop: Annotated[int, Field(ge=0, le=100)] = 100
    step: Annotated[int, Field(ge=1, le=100)] = 10
    percentages: list[Annotated[int, Field(ge=0, le=100)]] | None = None
    # Where to fall back if the very first percentage fails its gates.
    baseline: Annotated[int, Field(ge=0, le=100)] = 0
    gates: list[GateSpec] = Field(default_factory=list)
    bake: Duration = timedelta(0)
    approval: ApprovalSpec | None = None
    adaptive: AdaptiveSpec | None = Field(
        default=None, description="pick each next step from the gates' headroom; `step` is the first step's size")

    def schedule(self) -> list[int]:
        if self.percentages is not None:
            return list(self.percentages)
        return list(range(self.start, self.stop + 1, self.step))

    @model_validator(mode="after")
    def _increasing(self) -> RampSpec:
        plan = self.schedule()
        if not plan:
            raise ValueError("the ramp schedule is empty")
        if any(b <= a for a, b in itertools.pairwise(plan)):
            raise ValueError("ramp percentages must increase")
        if plan[0] <= self.baseline:
            raise ValueError("the first ramp percentage must be above the baseline")
        if self.adaptive is not None and self.percentages is not None:
            raise ValueError("an adaptive ramp picks its own percentages: give start, stop and step, not percentages")
        return self


class RampStep(_StepBase):
    ramp: RampSpec
    # A failed gate steps the ramp back to its last good percentage and waits for an operator.
    on_failure: OnFailure = OnFailure.hold


class ForEachSpec(StrictModel):
    items: list[Any] | str
    as_: Annotated[str, Field(alias="as", pattern=r"^[a-z][a-z0-9_]*$")] = "item"
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    max_concurrency: Annotated[int, Field(ge=1, le=1000)] = 10
    # Failures tolerated before the step fails: a count (3) or a share of the items ("1%").
    error_threshold: int | Annotated[str, Field(pattern=r"^\d+(\.\d+)?%$")] = 0
    timeout: Duration | None = None

    def allowed_failures(self, total: int) -> int:
        if isinstance(self.error_threshold, int):
            return self.error_threshold
        share = float(self.error_threshold.rstrip("%")) / 100.0
        return int(share * total + 1e-9)


class ForEachStep(_StepBase):
    for_each: ForEachSpec


class ParallelStep(_StepBase):
    parallel: list[Step]

    @field_validator("parallel")
    @classmethod
    def _not_empty(cls, value: list[Any]) -> list[Any]:
        if not value:
            raise ValueError("a parallel group needs at least one step")
        return value


# The one table of step kinds: a step's kind is the one kind key it carries, and its model.
STEP_TYPES: dict[str, type[_StepBase]] = {
    "action": ActionStep,
    "gate": GateStep,
    "approval": ApprovalStep,
    "wait": WaitStep,
    "ramp": RampStep,
    "for_each": ForEachStep,
    "parallel": ParallelStep,
}
STEP_KINDS = tuple(STEP_TYPES)
# The same models spelled out for the type checker, so an isinstance ladder over a step ends in
# typing.assert_never and a kind it misses fails `make check` (tests/test_step_kinds.py: the same set).
AnyStep = ActionStep | GateStep | ApprovalStep | WaitStep | RampStep | ForEachStep | ParallelStep
_KIND_OF = {model: kind for kind, model in STEP_TYPES.items()}


def step_kind(value: Any) -> str | None:
    """The kind of a step (a model, or a mapping as written) is the one kind key it carries."""
    if isinstance(value, _StepBase):
        return _KIND_OF.get(type(value))
    if isinstance(value, BaseModel):
        return None
    if isinstance(value, dict):
        kinds = [k for k in STEP_KINDS if k in value]
        return kinds[0] if len(kinds) == 1 else None
    return None


if TYPE_CHECKING:
    # What a type checker sees: one of the step models (pydantic picks which by the discriminator below).
    Step: TypeAlias = AnyStep
else:
    Step = Annotated[
        # A Union of a computed tuple has no `X | Y` spelling.
        Union[tuple(Annotated[model, Tag(kind)] for kind, model in STEP_TYPES.items())],  # noqa: UP007
        Discriminator(
            step_kind,
            custom_error_type="step_kind",
            custom_error_message="a step needs exactly one of: " + ", ".join(STEP_KINDS),
        ),
    ]
ParallelStep.model_rebuild()


Control = Literal["start", "approve", "skip", "retry", "abort", "pause", "resume"]


class IdentityPolicy(StrictModel):
    """Verified operator identity: short-lived OIDC id tokens signed by Vault's identity secrets engine, each
    carrying the nonce of one decision (run, step and verb) when `provider` is set."""

    vault: str = Field(description="the Vault whose OIDC keys sign the tokens; captured at run start")
    audience: str = Field(min_length=1, description="the OIDC client's client_id, the tokens' aud claim")
    provider: str | None = Field(
        default=None,
        description="the Vault OIDC provider (identity/oidc/provider/<name>) whose id tokens carry a decision's "
                    "nonce; new runs require it, so a token copied from a history serves no other decision")
    ca_cert: str | None = Field(default=None, description="the CA that signs the Vault's https certificate")
    role: str = Field(default="coldstart-approver",
                      description="the identity/oidc role of unbound tokens, kept for runs recorded before `provider`")
    name_claim: str = Field(default="name", description="the claim naming the person, matched against approvers and operators")
    controls: list[Control] = Field(
        default_factory=lambda: ["approve", "skip"],
        description="the controls that need a verified token (approvals and skips by default)",
    )


class DeadlineSpec(StrictModel):
    """A hard end for the whole run (a preemption notice, a maintenance window): no step runs past it."""

    at: AwareDatetime | Annotated[str, Field(pattern=r"\$\{\{")] | None = Field(
        default=None, description="absolute end, RFC 3339 with a zone or unix seconds; usually ${{ params.deadline }}")
    within: Duration | None = Field(default=None, description="end relative to the run's start")
    margin: Duration = Field(default=timedelta(0), description="finish this much before the end")
    max_ahead: Duration | None = Field(
        default=None,
        description="with `at`: refuse a run whose end is already past or further ahead than this when it is "
                    "planned (a notice's deadline is minutes away, never hours, never gone)",
    )
    on_miss: list[Step] = Field(
        default_factory=list,
        description="steps run when a step cannot finish in time (not bound by the deadline); the run then fails",
    )
    on_miss_after: StepId | None = Field(
        default=None,
        description="on_miss runs only once this step has succeeded (it confirmed what on_miss assumes, such as "
                    "the host's own preemption notice); a deadline missed before that only fails the run",
    )

    @model_validator(mode="after")
    def _has_end(self) -> DeadlineSpec:
        if self.at is None and self.within is None:
            raise ValueError("a deadline needs `at`, `within` or both")
        return self

    def end(self, started_at: datetime) -> datetime:
        """The instant steps must finish by; `at` must be resolved (a datetime) by now."""
        ends = [started_at + self.within] if self.within is not None else []
        if isinstance(self.at, datetime):
            ends.append(self.at)
        return min(ends) - self.margin


class PhaseObjective(StrictModel):
    """A phase of the recovery: it ends when step `until` succeeds, and should take at most `within`."""

    until: StepId = Field(description="the top-level step whose success ends the phase")
    within: Duration = Field(description="the phase's objective, from the end of the phase before it")


class Objectives(StrictModel):
    """Recovery objectives: the whole run and each phase, in step order; every run's scorecard measures them."""

    rto: Duration | None = Field(default=None, description="the whole recovery, from the run's start")
    phases: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=63)], PhaseObjective] = Field(
        default_factory=dict, description="consecutive phases in step order, each ending at its `until` step")


class Runbook(StrictModel):
    """A runbook file."""

    version: Literal[1] = 1
    metadata: Metadata
    target: str = Field(description="the inventory this runbook acts on, targets/<name>.yaml")
    params: dict[str, Param] = Field(default_factory=dict)
    approvers: list[str] = Field(default_factory=list, description="who may approve steps and skip held ones")
    operators: list[str] = Field(
        default_factory=list,
        description="who may retry, pause, resume and abort (approvers may too); empty: the approvers alone",
    )
    four_eyes: bool = Field(
        default=False,
        description="the initiator may not approve their own run, and a skip needs two different approvers",
    )
    identity: IdentityPolicy | None = None
    deadline: DeadlineSpec | None = None
    objectives: Objectives | None = None
    steps: list[Step]

    @field_validator("steps")
    @classmethod
    def _has_steps(cls, value: list[Any]) -> list[Any]:
        if not value:
            raise ValueError("a runbook needs at least one step")
        return value


class ActionDefaults(BaseModel):
    """Registry defaults for one action, pinned into the run input so replays see the same values."""

    name: str
    description: str = ""
    timeout: timedelta
    heartbeat: timedelta | None = None
    retry: Retry
    mutating: bool = False
    undo: str | None = None
    undo_from_output: str | None = None
