"""A runbook's cases file: scripted answers for its actions, gates and decisions, and the path each case expects."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from activities.errors import LocatedErrors
from activities.inventory import Inventory
from activities.registry import Registry
from activities.retry import Duration
from activities.strict import StrictModel
from workflows.loader import LocatedSource, locate_pydantic_errors, parse_located_yaml
from workflows.yaml_safety import YamlRefused, read_text

__all__ = [
    "Answer",
    "Case",
    "CaseBook",
    "CasesInvalid",
    "Decision",
    "Expect",
    "GateScript",
    "Reading",
    "cases_file_for",
    "load_cases",
]

Name = Annotated[str, Field(min_length=1, max_length=200)]


class CasesInvalid(LocatedErrors):
    """Every problem found in a cases file, one `file:line:col: message` line each."""


class Answer(StrictModel):
    """One call of an action: the outputs it returns, or the error it fails with."""

    outputs: dict[str, Any] | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Answer:
        if (self.outputs is None) == (self.error is None):
            raise ValueError("an answer gives either outputs or error")
        return self


class Failed(StrictModel):
    """A reading that fails (the source unreachable, the query broken): the gate fails closed."""

    error: str


# A number, no data (null), or an error.
Reading = float | Failed | None


class GateScript(StrictModel):
    """A gate's readings in order, the last one repeating; `at_percent` gives a ramp's gate its own per percentage."""

    readings: list[Reading] = Field(min_length=1)
    at_percent: dict[Annotated[int, Field(ge=0, le=100)], Annotated[list[Reading], Field(min_length=1)]] = Field(
        default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _short(cls, data: Any) -> Any:
        return {"readings": data} if isinstance(data, list) else data


class Decision(StrictModel):
    """An operator's answer to an approval (approve or refuse) or to a held step (retry, skip or abort).
    Refusing an approval aborts the run; with `undo`, its steps' undo actions run first. With `refused`,
    the run must turn the decision down (someone who may not decide it)."""

    approve: Name | None = None
    refuse: Name | None = None
    retry: Name | None = None
    skip: Name | None = None
    abort: Name | None = None
    reason: str = ""
    undo: bool = False
    refused: str | None = Field(default=None, description="the run must refuse this decision, its reason saying this; "
                                                           "the next decision then answers the same question")

    @model_validator(mode="after")
    def _one(self) -> Decision:
        given = [verb for verb in ("approve", "refuse", "retry", "skip", "abort") if getattr(self, verb) is not None]
        if len(given) != 1:
            raise ValueError("a decision names one of approve, refuse, retry, skip or abort, with who decides")
        return self

    @property
    def verb(self) -> str:
        return next(verb for verb in ("approve", "refuse", "retry", "skip", "abort") if getattr(self, verb) is not None)

    @property
    def actor(self) -> str:
        return getattr(self, self.verb)


def _listed(data: Any) -> Any:
    """A single answer or decision stands for a list of one."""
    return data if isinstance(data, list) else [data]


Answers = Annotated[list[Answer], Field(min_length=1)]
Decisions = Annotated[list[Decision], Field(min_length=1)]
RunEnd = Literal["succeeded", "failed", "aborted", "rolled_back", "held", "awaiting_approval"]


class Expect(StrictModel):
    """The path a case must take. Step lists must each hold (other steps may be anything); `state`,
    `stepped_back` and `approvals_asked` must match exactly when given."""

    state: RunEnd | None = None
    succeeded: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)
    held: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    undone: list[str] = Field(default_factory=list)
    not_run: list[str] = Field(default_factory=list)
    stepped_back: dict[str, list[int]] | None = Field(
        default=None, description="per ramp step, the percentages it stepped back to after a failed gate, in order")
    approvals_asked: list[str] | None = Field(default=None, description="the steps that asked for approval, in order")
    error: str | None = Field(default=None, description="a part of the run's error")


class _Scripts(StrictModel):
    params: dict[str, Any] = Field(default_factory=dict)
    from_start: dict[str, Duration] = Field(
        default_factory=dict, description="parameters that are a time: this long after the case starts (RFC 3339)")
    actions: dict[str, Answers] = Field(default_factory=dict)
    gates: dict[str, GateScript] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _single_answers(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("actions"), dict):
            data = {**data, "actions": {name: _listed(answers) for name, answers in data["actions"].items()}}
        return data


class Case(_Scripts):
    """One path through the runbook: its own answers (over the file's), its decisions, what it expects."""

    name: Name
    approvals: dict[str, Decisions] = Field(default_factory=dict)
    holds: dict[str, Decisions] = Field(default_factory=dict)
    expect: Expect

    @model_validator(mode="before")
    @classmethod
    def _single_decisions(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for kind in ("approvals", "holds"):
                if isinstance(data.get(kind), dict):
                    data = {**data, kind: {step: _listed(d) for step, d in data[kind].items()}}
        return data

    @model_validator(mode="after")
    def _decided_right(self) -> Case:
        for step, decisions in self.approvals.items():
            if any(d.verb not in ("approve", "refuse") for d in decisions):
                raise ValueError(f"approvals of {step}: approve or refuse")
        for step, decisions in self.holds.items():
            if any(d.verb not in ("retry", "skip", "abort") for d in decisions):
                raise ValueError(f"holds of {step}: retry, skip or abort")
        return self


class CaseBook(_Scripts):
    """A cases file: the target the runbook is planned against, answers every case shares, and the cases."""

    version: Literal[1]
    target: Inventory | Name | None = Field(
        default=None, description="the inventory to plan against, or a target's name (its file under targets/)")
    initiator: Name = "coldstart-test"
    drill: bool = False
    timeout: Duration = Field(default=timedelta(seconds=60), description="the wall time a case may take")
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> CaseBook:
        names = [case.name for case in self.cases]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"case names must be unique: {', '.join(repeated)}")
        return self


def cases_file_for(runbook: Path) -> Path:
    """Where a runbook's cases live by default: cases/NAME.yaml beside it."""
    return runbook.parent / "cases" / runbook.name


def load_cases(path: str | Path, contracts: Registry | None = None) -> CaseBook:
    """Read and validate a cases file; CasesInvalid with every problem located in the file. With `contracts`,
    each scripted action must be one of them and each output it scripts one that action returns, of its type."""
    file = str(path)
    source = LocatedSource(file=file)
    try:
        text = read_text(file)
    except OSError as exc:
        raise CasesInvalid([f"{file}:1:1: cannot read: {exc.strerror or exc}"]) from None
    except YamlRefused as exc:
        raise CasesInvalid([exc.located(file)]) from None
    parse_located_yaml(text, source)
    if source.errors:
        raise CasesInvalid(source.formatted())
    if not isinstance(source.data, dict):
        raise CasesInvalid([f"{file}:1:1: a cases file is a mapping with version, target and cases"])
    try:
        book = CaseBook.model_validate(source.data)
    except ValidationError as exc:
        locate_pydantic_errors(exc, source, (), source.data)
        raise CasesInvalid(source.formatted()) from None
    if contracts is not None:
        _check_against(contracts, source)
        if source.errors:
            raise CasesInvalid(source.formatted())
    return book


def _check_against(contracts: Registry, source: LocatedSource) -> None:
    """Scripted outputs an action could never return would test a path production never takes."""
    data = source.data
    holders: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    holders += [(("cases", i), case) for i, case in enumerate(data.get("cases") or [])]
    for base, holder in holders:
        actions = holder.get("actions") if isinstance(holder, dict) else None
        for name, answers in (actions or {}).items():
            spec = contracts.get(name)
            if spec is None:
                source.error((*base, "actions", name), f"unknown action {name!r}", key=True)
                continue
            if spec.output_model is None:
                continue
            declared = {f.alias or n for n, f in spec.output_model.model_fields.items()}
            listed = answers if isinstance(answers, list) else [answers]
            for j, answer in enumerate(listed):
                if not isinstance(answer, dict) or answer.get("outputs") is None:
                    continue
                at = (*base, "actions", name, *((j,) if isinstance(answers, list) else ()), "outputs")
                outputs = answer["outputs"]
                for unknown in (sorted(set(outputs) - declared) if isinstance(outputs, dict) else []):
                    source.error((*at, unknown), f"{unknown!r} is not an output of {name} (it returns: "
                                                 f"{', '.join(sorted(declared))})", key=True)
                try:
                    spec.output_model.model_validate(outputs)
                except ValidationError as exc:
                    # A case scripts only the outputs the runbook reads: a field left out is fine, a field the
                    # action never returns, or of another type, is not.
                    for err in exc.errors(include_url=False):
                        if err["type"] == "missing":
                            continue
                        field = ".".join(str(part) for part in err["loc"]) or "outputs"
                        source.error((*at, *err["loc"]), f"{name} cannot return this: {field}: {err['msg']}")
