"""Workflow inputs, operator requests and the status a run reports: the data crossing Temporal."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from activities.errors import InvalidInput
from activities.oidc import IdentityKeys
from workflows.names import RunbookName, TargetName
from workflows.seals import Seal
from workflows.spec import ActionDefaults, ForEachSpec, Metadata, Runbook

__all__ = [
    "MEMO_CHUNK",
    "MEMO_RUN",
    "MEMO_STEP",
    "MEMO_STEPS",
    "RAMP_DECISIONS_KEPT",
    "RESOLVE_HEARTBEAT",
    "RESOLVE_RUN_ACTIVITY",
    "SCHEDULED_SUFFIX",
    "ApprovalRecord",
    "ApproveRequest",
    "CatalogRecord",
    "ControlRecord",
    "ControlRequest",
    "FanOutInput",
    "FanOutResult",
    "FleetInput",
    "FleetMember",
    "FleetMemberState",
    "FleetOnFailure",
    "FleetState",
    "FleetStatus",
    "GateReading",
    "RequestError",
    "RunInput",
    "RunOutcome",
    "RunRequest",
    "RunResult",
    "RunStart",
    "RunStatus",
    "SealedFanOut",
    "SealedRun",
    "StatusMemo",
    "StepState",
    "StepStatus",
    "UndoRecord",
    "drill_schedule_id",
    "parse_request",
    "parsed_start",
    "readings_queue",
    "status_from_memo",
    "status_memo",
    "workflow_id_for",
]

StepStatus = Literal[
    "pending",
    "running",
    "awaiting_approval",
    "held",
    "succeeded",
    "failed",
    "skipped",
    "rolled_back",
    "aborted",
]


# The worker's activity that resolves a run request against its catalog (runtime/catalog.py), and its
# heartbeat timeout: a run whose resolution was lost with its worker waits that long, not the minute of its
# start-to-close timeout (bench/soak.py read a run stood still 61 s after a worker's SIGKILL).
RESOLVE_RUN_ACTIVITY = "coldstart.resolve_run"
RESOLVE_HEARTBEAT = timedelta(seconds=10)

# An adaptive ramp's decisions kept on its step: a long ramp holding and backing off decides every bake, and
# the step travels whole in every status query and memo; the views read the recent ones.
RAMP_DECISIONS_KEPT = 50


_Start = TypeVar("_Start", bound=BaseModel)


def readings_queue(task_queue: str) -> str:
    """Where a run's gate readings go: a queue of its own beside the run's, which every worker also
    polls at a bounded rate, so a flood of readings waits in the server, never in front of a step."""
    return f"{task_queue}-readings"


# What a Temporal Schedule appends to the workflow id of each run it starts.
SCHEDULED_SUFFIX = re.compile(r"-\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def drill_schedule_id(runbook: str, target: str) -> str:
    """The id of the Temporal Schedule that starts a runbook's drills on a target (`coldstart schedule`)."""
    return f"drill-{runbook}-{target}"


def workflow_id_for(target: str) -> str:
    """A run's workflow id: one per target, so a second run on a busy target is refused (single flight)."""
    return "coldstart-" + re.sub(r"[^A-Za-z0-9_.-]", "-", target)


class GateReading(BaseModel):
    """One sample of a gate: the value read, whether it passed, or why there is no value."""

    gate: str
    at: datetime
    value: float | None = None
    passed: bool = False
    error: str | None = None
    percent: int | None = None
    # What the value was held against (readings before these fields carry neither).
    comparator: str | None = None
    threshold: float | None = None


class RampDecision(BaseModel):
    """Why an adaptive ramp went where it went (workflows/ramp_policy.py), kept on its step for the views."""

    at: int  # the percentage whose gates were just read
    next: int  # where the ramp goes now (after a step-back: the percentage it tries next)
    step: int  # the step size from here
    headroom: dict[str, float | None] = Field(default_factory=dict)  # each gate's, trend included
    reason: str


class ApprovalRecord(BaseModel):
    step: str
    approver: str
    comment: str = ""
    at: datetime
    percent: int | None = None
    # The identity token's subject (the Vault entity id) when the runbook requires verified identity.
    subject: str | None = None


class ControlRecord(BaseModel):
    """An accepted operator control (retry, skip, abort, pause, resume), kept in the run's status."""

    verb: str
    step: str | None = None
    actor: str
    reason: str = ""
    at: datetime
    subject: str | None = None
    # The Update that carried it (None for a Signal): how the timeline finds a decision's verified subject.
    update_id: str | None = None


class UndoRecord(BaseModel):
    """An undo action computed when its step completed, run in reverse order on rollback."""

    step: str
    action: str
    args: dict[str, Any]


class StepState(BaseModel):
    id: str
    kind: str
    title: str = ""
    status: StepStatus = "pending"
    started_at: datetime | None = None
    ended_at: datetime | None = None
    attempts: int = 0
    outputs: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    readings: list[GateReading] = Field(default_factory=list)
    approvals: list[ApprovalRecord] = Field(default_factory=list)
    percent: int | None = None
    last_good: int | None = None
    awaiting: str | None = None
    # Four eyes on skip: the first approver's request, waiting for a second one.
    skip_requested_by: str | None = None
    # A gate step's (or a ramp's) gate: when the gate reading now gives up, its timeout from its first reading.
    gate_gives_up_at: datetime | None = None
    # An adaptive ramp's last RAMP_DECISIONS_KEPT decisions, oldest first.
    ramp_decisions: list[RampDecision] = Field(default_factory=list)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        self._changed()

    def on_change(self, call: Callable[[str], None] | None) -> None:
        """Have `call(step id)` told after every field set and every add_*: the run's status upkeep then
        recomputes only the steps it was told of (workflows/step_changes.py). Kept outside the fields, so
        neither dumps nor comparisons see it."""
        object.__setattr__(self, _ON_CHANGE, call)

    def add_reading(self, reading: GateReading, keep: int) -> None:
        """Append a gate reading, keeping the last `keep`."""
        self.readings.append(reading)
        del self.readings[:-keep]
        self._changed()

    def add_approval(self, record: ApprovalRecord) -> None:
        self.approvals.append(record)
        self._changed()

    def add_ramp_decision(self, decision: RampDecision, keep: int = RAMP_DECISIONS_KEPT) -> None:
        """Append an adaptive ramp's decision, keeping the last `keep`."""
        self.ramp_decisions.append(decision)
        del self.ramp_decisions[:-keep]
        self._changed()

    def _changed(self) -> None:
        call = self.__dict__.get(_ON_CHANGE)
        if call is not None:
            call(self.id)


# Where a step keeps its change listener: a key of its __dict__ that is no field; pydantic's dumps, comparisons,
# repr and dict(step) leave it out (the last for its leading underscore).
_ON_CHANGE = "_coldstart_on_change"


class RunRequest(BaseModel):
    """What a starter asks for: a runbook (its text and content digest), a target by name, parameters and who
    starts it. The worker resolves it against its own catalog (runtime/catalog.py) and runs only what that
    yields: the runbook, the inventory and the policy come from the controller, never from the request."""

    model_config = ConfigDict(extra="forbid")

    runbook: RunbookName = Field(description="the runbook's metadata.name")
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="sha256 of the runbook file's text")
    # The text is used only on a target the catalog marks `development: true`; elsewhere the digest must
    # name a catalogued runbook.
    text: str = Field(max_length=1_048_576)
    source: str = Field(max_length=1_000)
    # A name, never a path: the worker reads its inventory as targets/<target>.yaml (workflows/names.py).
    target: TargetName
    # The inventory the starter planned against: refused unless it is the catalog's own.
    inventory: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    initiator: str = Field(max_length=200)
    drill: bool = False
    # The starter's identity token, bound to this request (workflows/identity.start_nonce); the controller
    # requires one where the target's policy or four eyes with verified approvals needs a verified starter.
    identity_token: str | None = Field(default=None, max_length=16_384)


class CatalogRecord(BaseModel):
    """Which runbook version a run executed, where the controller found it, and which controller resolved it:
    its version and the digest of its actions' contracts (runtime/action_versions.catalog_build_id)."""

    digest: str
    origin: Literal["catalog", "development"]
    path: str = ""
    controller: str = ""
    contracts: str = ""


class RunInput(BaseModel):
    """Everything a run needs, validated and with start-time references resolved.

    A starter sends it with `request` set; a new run resolves that request on the worker and replaces the
    rest of this input with the controller's own plan (`catalog` then says which version ran)."""

    runbook: Runbook
    source: str
    params: dict[str, Any] = Field(default_factory=dict)
    target: dict[str, Any] = Field(default_factory=dict)
    target_name: str
    initiator: str
    # The Vault entity that started the run, when the controller verified the starter's token.
    initiator_subject: str | None = None
    drill: bool = False
    actions: dict[str, ActionDefaults] = Field(default_factory=dict)
    request: RunRequest | None = None
    catalog: CatalogRecord | None = None
    # Carried across continue-as-new.
    resume: ResumeState | None = None


class ResumeState(BaseModel):
    next_index: int
    steps: dict[str, StepState]
    undo_stack: list[UndoRecord]
    outputs: dict[str, dict[str, Any]]
    paused: bool = False
    started_at: datetime
    identity_keys: IdentityKeys | None = None
    controls: list[ControlRecord] = Field(default_factory=list)
    used_tokens: list[str] = Field(default_factory=list)


class SealedRun(BaseModel):
    """A run's plan and progress handed to its own continuation, sealed by the worker that handed it on."""

    model_config = ConfigDict(extra="forbid")

    plan: RunInput
    seal: Seal


def parsed_start(model: type[_Start], raw: _Start | dict[str, Any]) -> tuple[_Start | None, str | None]:
    """A workflow's start input as `model`, or why it is not one (one line, never echoing values). A workflow
    takes `model | dict` so that an input of another shape ends the run with this reason instead of failing
    its workflow tasks forever (which would also hold the target's workflow id)."""
    if isinstance(raw, model):
        return raw, None
    try:
        return parse_request(model, raw), None
    except RequestError as exc:
        return None, f"the start input is not a {model.__name__}: {exc}"


class RunStart(BaseModel):
    """RunbookWorkflow's only input. A starter (the CLI, a trigger, a Schedule, a fleet) sends `request` alone,
    which the worker resolves against its catalog; `sealed` is the controller's own, from the run it continues
    (verified before the first command). Anything else is refused before any step."""

    model_config = ConfigDict(extra="forbid")

    request: RunRequest | None = None
    sealed: SealedRun | None = None

    def placeholder(self) -> RunInput:
        """What the run shows until its plan is resolved or verified: the names the start gave, no steps."""
        if self.sealed is not None:
            plan = self.sealed.plan
            name, target, initiator, drill = plan.runbook.metadata.name, plan.target_name, plan.initiator, plan.drill
        elif self.request is not None:
            request = self.request
            name, target, initiator, drill = request.runbook, request.target, request.initiator, request.drill
        else:
            name, target, initiator, drill = "unresolved", "", "", False
        return RunInput.model_construct(
            runbook=Runbook.model_construct(metadata=Metadata.model_construct(name=name, description="", owner=""),
                                            target="", steps=[], approvers=[]),
            source="", params={}, target={}, target_name=target, initiator=initiator, initiator_subject=None,
            drill=drill, actions={}, request=None, catalog=None, resume=None)


class RunStatus(BaseModel):
    workflow_id: str
    runbook: str
    target: str
    initiator: str
    drill: bool
    state: Literal["running", "paused", "succeeded", "failed", "aborted", "rolled_back"]
    current_step: str | None = None
    awaiting_approval: list[str] = Field(default_factory=list)
    held: list[str] = Field(default_factory=list)
    started_at: datetime
    ended_at: datetime | None = None
    steps: list[StepState]
    error: str | None = None
    controls: list[ControlRecord] = Field(default_factory=list)
    identity_required: list[str] = Field(default_factory=list)
    # Where decision tokens come from (the Vault, its OIDC provider and client): public, for the CLI and approvers.
    identity_source: dict[str, str] = Field(default_factory=dict)
    # The runbook version the run executed (sha256 of its text) and where the controller found it.
    runbook_digest: str | None = None
    runbook_origin: str | None = None
    # The controller that resolved the run: its version and its actions' contracts digest.
    controller_version: str | None = None
    contracts_digest: str | None = None
    # Who may decide now, for the views' next commands: each step awaiting approval's approvers (None: anyone
    # named; four eyes leaves out the initiator), who may skip a held step (None: a run from before this was
    # said), and who may retry, pause, resume or abort (empty: nobody; None: anyone named, in a run recorded
    # before operators were always named).
    approvers: dict[str, list[str] | None] = Field(default_factory=dict)
    skippers: list[str] | None = None
    operators: list[str] | None = None

    @property
    def over(self) -> bool:
        """The run has ended (succeeded, failed, aborted, rolled back); a paused run has not."""
        return self.state not in ("running", "paused")


# A running run's status, kept in its memo: a live view reads it with describe(), from the server, and
# never Queries the worker. Steps' outputs and all but the last reading stay in the status Query.
# The status memo's keys (cli/timeline.py reads the upserts too): the run's own fields; a step in play
# (running, awaiting approval, held) under its own key, so a gate's readings upsert only its entry; the
# other steps by MEMO_CHUNK under one key, `coldstart.steps.<first position>`, a list with a null where a
# step in play is. The server keeps the memo in the run's mutable state and handles every key of it again
# with each transaction of the run: a 200-step run's 201 keys cost each step up to about 0.5 ms more than the
# same bytes under 11 (bench/README.md). Runs started before chunks keep one key per step.
MEMO_RUN = "coldstart.run"
MEMO_STEP = "coldstart.step."
MEMO_STEPS = "coldstart.steps."
MEMO_CHUNK = 20
_IN_PLAY = frozenset({"running", "awaiting_approval", "held"})


# A memo over the server's limit (2 MB total by default) would end the run: the status stops being
# kept well before (views then Query, as for older runs), and long texts are cut.
MEMO_BUDGET = 128 * 1024
_MEMO_TEXT = 500


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= _MEMO_TEXT else text[: _MEMO_TEXT - 1] + "…"


# What a step's memo entry is made of, compared instead of dumping the step again (a run of 200 steps
# dumped 40,000 of them): every field but `outputs`, lists by their items (appended, never edited), the
# readings by the last one. A field added to StepState must be added here (checked below).
def _step_fingerprint(step: StepState) -> tuple:
    return (step.title, step.status, step.started_at, step.ended_at, step.attempts, step.error, step.percent,
            step.last_good, step.awaiting, step.skip_requested_by, step.gate_gives_up_at,
            step.readings[-1] if step.readings else None, tuple(step.approvals), tuple(step.ramp_decisions))


_FINGERPRINTED = {"id", "kind", "title", "status", "started_at", "ended_at", "attempts", "error", "percent", "last_good",
                  "awaiting", "skip_requested_by", "gate_gives_up_at", "readings", "approvals", "ramp_decisions"}
assert set(StepState.model_fields) == _FINGERPRINTED | {"outputs"}, "StepState changed: update _step_fingerprint"


# Compact entries leave out every field at its default (a pending step is its position, id, kind and title):
# the server keeps the memo in the run's mutable state and writes all of it again with every transaction,
# so its size is paid on every step. Readers fill the defaults back in (status_from_memo, cli/timeline.py);
# the full form stays for runs started before it.
def _step_entry(step: StepState, position: int, compact: bool) -> dict[str, Any]:
    entry = _dumped(step, compact, ("error", "awaiting"), exclude={"outputs", "readings"})
    if step.readings or not compact:
        entry["readings"] = [_dumped(reading, compact, ("error",)) for reading in step.readings[-1:]]
    return {"position": position, **entry}


def _run_entry(status: RunStatus, compact: bool) -> dict[str, Any]:
    return _dumped(status, compact, ("error",), exclude={"steps"})


def _dumped(model: BaseModel, compact: bool, texts: tuple[str, ...], **dump: Any) -> dict[str, Any]:
    """`model` as JSON, its defaults left out when `compact`, the long `texts` among its fields cut."""
    entry = model.model_dump(mode="json", exclude_defaults=compact, **dump)
    for field in texts:
        if field in entry:  # always, in the full form
            entry[field] = _cut(entry[field])
    return entry


def status_memo(status: RunStatus, cache: dict[str, tuple[tuple, dict[str, Any]]] | None = None,
                compact: bool = True) -> dict[str, Any]:
    """The memo entries that describe `status`: the run's, and one per step (no outputs, last reading only).
    `cache` (step key -> (fingerprint, entry)) keeps each step's entry until the step changes."""
    entries: dict[str, Any] = {MEMO_RUN: _run_entry(status, compact)}
    for position, step in enumerate(status.steps):
        key = MEMO_STEP + step.id
        if cache is None:
            entries[key] = _step_entry(step, position, compact)
            continue
        fingerprint = (position, step.id, step.kind, _step_fingerprint(step))
        kept = cache.get(key)
        if kept is None or kept[0] != fingerprint:
            kept = cache[key] = (fingerprint, _step_entry(step, position, compact))
        entries[key] = kept[1]
    return entries


class StatusMemo:
    """What a run has put in its memo, and what to upsert next: the entries that changed, within MEMO_BUDGET
    bytes in all; past it, one last upsert marks the status as no longer kept. With `chunk`, steps not in
    play are kept `chunk` to a key (MEMO_STEPS); without, each under its own key (runs from before chunks)."""

    def __init__(self, budget: int = MEMO_BUDGET, compact: bool = True, chunk: int | None = None) -> None:
        self._budget = budget
        self._compact = compact
        self._chunk = chunk
        self._sent: dict[str, Any] = {}
        self._sizes: dict[str, int] = {}
        self._size = 0
        # Each step's (fingerprint, entry, the entry without its position for a chunk's slot).
        self._entries: dict[str, tuple[tuple, dict[str, Any], dict[str, Any]]] = {}
        # Chunked: each chunk's slots (first position -> a slot entry, or None while the step is in play).
        self._slots: dict[int, list[dict[str, Any] | None]] = {}
        self.full = False

    def changes(self, status: RunStatus) -> dict[str, Any]:
        """The entries of `status` that differ from those sent."""
        return self.changes_in(status, enumerate(status.steps))

    def changes_in(self, run: RunStatus, steps: Iterable[tuple[int, StepState]]) -> dict[str, Any]:
        """The entries that differ from those sent, when only `steps` (position, step; by position) may have
        changed since the last call, the first call naming every step: `run` supplies the run's entry (its
        steps are not read). The same entries as changes() with the whole status. A key whose step left
        play maps to None: the upsert removes it."""
        if self.full:
            return {}
        entries: dict[str, Any] = {MEMO_RUN: _run_entry(run, self._compact)}
        chunks: list[int] = []
        for position, step in steps:
            key = MEMO_STEP + step.id
            fingerprint = (position, step.id, step.kind, _step_fingerprint(step))
            kept = self._entries.get(key)
            if kept is None or kept[0] != fingerprint:
                entry = _step_entry(step, position, self._compact)
                slot = entry if self._chunk is None else {k: v for k, v in entry.items() if k != "position"}
                kept = self._entries[key] = (fingerprint, entry, slot)
            if self._chunk is None or step.status in _IN_PLAY:
                entries[key] = kept[1]
            else:
                entries[key] = None  # removed if it was sent while the step was in play
            if self._chunk is not None:
                first = position - position % self._chunk
                slots = self._slots.setdefault(first, [])
                slots.extend([None] * (position - first + 1 - len(slots)))
                slots[position - first] = None if step.status in _IN_PLAY else kept[2]
                if not chunks or chunks[-1] != first:
                    chunks.append(first)
        for first in chunks:
            entries[MEMO_STEPS + str(first)] = list(self._slots[first])
        # An entry from the cache is the very object sent last time: `is` settles most comparisons.
        changed = {key: entry for key, entry in entries.items()
                   if (sent := self._sent.get(key)) is not entry and sent != entry}
        sizes = {key: 0 if entry is None else len(json.dumps(entry, separators=(",", ":"))) for key, entry in changed.items()}
        size = self._size + sum(size - self._sizes.get(key, 0) for key, size in sizes.items())
        if size > self._budget:
            self.full = True
            return {MEMO_RUN: {"kept": False}}
        self._sent.update(changed)
        self._sizes.update(sizes)
        self._size = size
        return changed


def status_from_memo(memo: Mapping[str, Any]) -> RunStatus | None:
    """The status a run's memo holds; None if it holds none (a run started before the memo was kept,
    or one whose status outgrew MEMO_BUDGET)."""
    if MEMO_RUN not in memo or memo[MEMO_RUN].get("kept") is False:
        return None
    entries = [value for key, value in memo.items() if key.startswith(MEMO_STEP) and isinstance(value, dict)]
    try:
        for key, value in memo.items():
            if key.startswith(MEMO_STEPS) and isinstance(value, list):
                first = int(key.removeprefix(MEMO_STEPS))
                entries += [{**entry, "position": first + slot} for slot, entry in enumerate(value) if isinstance(entry, dict)]
        entries.sort(key=lambda entry: entry["position"])
        return RunStatus.model_validate({**memo[MEMO_RUN], "steps": entries})
    except (ValidationError, ValueError, KeyError, TypeError):
        return None


# How a run ended.
RunOutcome = Literal["succeeded", "failed", "aborted", "rolled_back"]


class RunResult(BaseModel):
    """How a run ended, in its close event: with the status last seen, all a closed run's view needs
    (runtime/polling.py), so nobody has to Query, and the worker replay, a run that is over."""

    state: RunOutcome
    steps: list[StepState]
    error: str | None = None
    # Since the close-event view (runs closed before it carry neither).
    ended_at: datetime | None = None
    controls: list[ControlRecord] = Field(default_factory=list)


# Operator requests come from the CLI and from anyone who can reach the Temporal Web UI: bounded,
# printable, no unknown fields. Bidi overrides and other format characters are refused too, so a
# timeline can not be made to read differently from what was sent.
_MAX_NAME = 64
_MAX_TEXT = 1000
_MAX_TOKEN = 16384
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*$")


def _clean(kind: str, limit: int, *, multiline: bool = False):
    def check(value: str) -> str:
        if len(value) > limit:
            raise ValueError(f"{kind} is {len(value)} characters, at most {limit} allowed")
        bad = _CONTROL.search(value) or (None if multiline else re.search(r"[\n\t]", value))
        if bad:
            raise ValueError(f"{kind} contains control character U+{ord(bad.group()):04X}")
        return value

    return AfterValidator(check)


def _no_parentheses(value: str) -> str:
    # The timeline writes a verified decision as `name (verified <subject>)`: a name cannot fake that.
    if "(" in value or ")" in value:
        raise ValueError("a name cannot contain parentheses")
    return value


Name = Annotated[str, _clean("a name", _MAX_NAME), AfterValidator(_no_parentheses)]
Text = Annotated[str, _clean("the text", _MAX_TEXT, multiline=True)]
StepRef = Annotated[str, _clean("a step id", 63)]


def _token(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > _MAX_TOKEN:
        raise ValueError(f"the identity token is {len(value)} characters, at most {_MAX_TOKEN} allowed")
    if not _TOKEN.match(value):
        raise ValueError("the identity token is not a signed JWT (three base64url parts joined by dots)")
    return value


Token = Annotated[str | None, AfterValidator(_token)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ApproveRequest(_Request):
    """Update `approve`: the approver takes responsibility for the step going ahead."""

    step: StepRef
    approver: Name
    comment: Text = ""
    identity_token: Token = Field(default=None, description="a Vault OIDC identity token, when the runbook requires one")


class ControlRequest(_Request):
    """Updates retry/skip/abort/pause/resume: who asks, for which step, and why."""

    step: StepRef | None = None
    actor: Name
    reason: Text = ""
    identity_token: Token = Field(default=None, description="a Vault OIDC identity token, when the runbook requires one")
    undo: bool = Field(default=False, description="abort only: undo what the run changed (its steps' undo actions, "
                                                  "newest first) before it ends")


class RequestError(InvalidInput):
    """An operator request that does not fit its model, said in one line."""


def parse_request(model: type[BaseModel], raw: Any) -> Any:
    """The request as `model`, or RequestError naming every offending field (never echoing values)."""
    if isinstance(raw, model):
        raw = raw.model_dump()
    if not isinstance(raw, dict):
        raise RequestError(f"{model.__name__} must be a JSON object, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False):
            where = ".".join(str(p) for p in error["loc"]) or "request"
            if error["type"] == "extra_forbidden":
                problems.append(f"unknown field {where!r} (allowed: {', '.join(model.model_fields)})")
            elif error["type"] == "missing":
                problems.append(f"field {where!r} is required")
            else:
                message = error["msg"].removeprefix("Value error, ")
                problems.append(f"field {where!r}: {message}")
        raise RequestError(f"{model.__name__}: " + "; ".join(problems)[:600]) from None


class FanOutInput(BaseModel):
    """A for_each fan-out, or one batch of it handed to a child workflow when it is large."""

    step_id: str
    spec: ForEachSpec
    items: list[Any]
    context: dict[str, Any]
    action: ActionDefaults
    attempt: int = 1
    offset: int = Field(default=0, description="the step-wide index of items[0] (activity ids name it)")
    allowed: int | None = Field(default=None, description="failures this batch may still have; None: the spec's threshold")
    concurrency: int | None = Field(default=None, description="this batch's share of max_concurrency; None: all of it")
    keep_results: bool = Field(default=True, description="hand back every item's output (a later step reads them)")


class SealedFanOut(BaseModel):
    """FanOutWorkflow's only input: a batch its parent run made, sealed for that child id and that parent run."""

    model_config = ConfigDict(extra="forbid")

    batch: FanOutInput
    seal: Seal


class FanOutResult(BaseModel):
    """A fan-out's summary: counts, the first failures with their reasons, and the items that succeeded as ranges."""

    total: int
    succeeded: int
    failed: int
    failures: list[str] = Field(default_factory=list)
    results: list[Any] | None = Field(default_factory=list, description="each item's output (None: not kept)")
    done: list[list[int]] = Field(default_factory=list, description="[first, last] index ranges of the items that succeeded")
    results_missing: str | None = Field(default=None, description="why results were asked for and not kept")


RunInput.model_rebuild()
RunStart.model_rebuild()
SealedRun.model_rebuild()


# ---- fleet-wide runs: one runbook on many targets, in waves --------------------------------------


class FleetMember(BaseModel):
    """One target of a fleet run: its wave and its run's request (planned and validated by the starter before
    the start); the member's run resolves the request at its own door, as every run does."""

    model_config = ConfigDict(extra="forbid")

    target: TargetName
    wave: int = Field(ge=1)
    request: RunRequest


FleetOnFailure = Literal["stop", "continue"]


class FleetInput(BaseModel):
    """A fleet run: the members in wave order, how many run at once, and what a failure does."""

    name: str
    runbook: str
    initiator: str
    members: list[FleetMember] = Field(min_length=1)
    max_parallel: int = Field(default=0, ge=0, description="runs at once within a wave; 0 = the whole wave")
    on_failure: FleetOnFailure = Field(
        default="stop", description="stop: no later wave starts after a wave with a failed run; continue: every wave runs")


FleetMemberStatus = Literal["pending", "running", "succeeded", "failed", "busy", "skipped"]
FleetState = Literal["running", "succeeded", "failed"]


class FleetMemberState(BaseModel):
    target: str
    wave: int
    workflow_id: str
    run_id: str | None = None
    state: FleetMemberStatus = "pending"
    error: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None


class FleetStatus(BaseModel):
    workflow_id: str
    name: str
    runbook: str
    initiator: str
    state: FleetState
    wave: int | None = Field(default=None, description="the wave running now")
    max_parallel: int
    on_failure: str
    members: list[FleetMemberState]
    started_at: datetime
    ended_at: datetime | None = None
    error: str | None = None
