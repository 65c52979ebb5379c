"""The status memo's upkeep reads only the steps that changed, and upserts exactly what reading every step upserts."""

from __future__ import annotations

import ast
import base64
import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from runtime.connection import DATA_CONVERTER
from runtime.polling import read_kept_status
from tests import support
from workflows.contract import (
    MEMO_CHUNK,
    ApprovalRecord,
    ApproveRequest,
    ControlRequest,
    GateReading,
    RampDecision,
    RunResult,
    RunStart,
    RunStatus,
    StatusMemo,
    StepState,
    status_from_memo,
)
from workflows.fanout import FanOutWorkflow
from workflows.runbook_workflow import RunbookWorkflow
from workflows.step_changes import StatusWatch, StepChanges, StepsInPlay

ROOT = Path(__file__).parent.parent
HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
NOW = datetime(2026, 1, 1, tzinfo=UTC)

# The whole-run signature, as the upkeep compared it before it read only the changed steps: the reference.
_SIGNED = attrgetter("status", "attempts", "error", "percent", "last_good", "awaiting", "skip_requested_by",
                     "gate_gives_up_at")
_LAST_READING = attrgetter("gate", "value", "passed", "error")


def whole_signature(run: RunbookWorkflow) -> tuple:
    steps = tuple(map(_SIGNED, run._steps.values()))
    readings = tuple(_LAST_READING(s.readings[-1]) for s in run._steps.values() if s.readings)
    approvals = tuple(len(s.approvals) for s in run._steps.values())
    return (run._state, run._paused, run._error, tuple(run._awaiting), len(run._controls), steps, readings, approvals)


# ---- every change of a step is reported ----------------------------------------------------------------

_VALUES: dict[str, Any] = {
    "id": "other", "kind": "gate", "title": "t", "status": "running", "started_at": NOW, "ended_at": NOW,
    "attempts": 3, "outputs": {"a": 1}, "error": "e", "readings": [], "approvals": [], "percent": 5,
    "last_good": 4, "awaiting": "ok?", "skip_requested_by": "bob", "gate_gives_up_at": NOW, "ramp_decisions": [],
}


def test_every_field_set_and_every_addition_reports_the_step():
    assert set(_VALUES) == set(StepState.model_fields)
    told: list[str] = []
    for name, value in _VALUES.items():
        step = StepState(id="s", kind="action")
        step.on_change(told.append)
        setattr(step, name, value)
        assert told == [step.id], name
        told.clear()
    step = StepState(id="s", kind="action")
    step.on_change(told.append)
    for _ in range(3):
        step.add_reading(GateReading(gate="g", at=NOW, value=1.0), keep=2)
    step.add_approval(ApprovalRecord(step="s", approver="bob", at=NOW))
    step.add_ramp_decision(RampDecision(at=10, next=20, step=10, reason="r"))
    assert told == ["s"] * 5 and len(step.readings) == 2 and len(step.approvals) == len(step.ramp_decisions) == 1
    # The listener is no field: dumps and comparisons do not see it; without one, nobody is told.
    plain = StepState.model_validate(step.model_dump())
    assert plain == step and plain.model_dump() == step.model_dump() and "on_change" not in step.model_dump_json()
    assert dict(plain) == dict(step) and repr(plain) == repr(step)
    step.on_change(None)
    step.status = "failed"
    assert len(told) == 5


# What edits a step's lists in place: only StepState's own add_* may (they report the change).
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "__setitem__", "__delitem__"}
_LISTS = {"readings", "approvals", "ramp_decisions"}


def _list_edits(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            target = node.func.value
        elif isinstance(node, ast.Delete | ast.Assign | ast.AugAssign):
            for item in node.targets if isinstance(node, ast.Delete | ast.Assign) else [node.target]:
                if isinstance(item, ast.Subscript):
                    target = item.value
                elif isinstance(node, ast.AugAssign):
                    target = item
        if isinstance(target, ast.Attribute) and target.attr in _LISTS:
            lines.append(target.lineno)
    return lines


def test_workflow_code_edits_a_steps_lists_only_through_its_additions():
    edits = {path.name: lines for path in sorted((ROOT / "workflows").glob("*.py"))
             if path.name != "contract.py" and (lines := sorted(_list_edits(ast.parse(path.read_text()))))}
    assert edits == {}
    # The scan finds what it looks for.
    assert sorted(_list_edits(ast.parse("s.readings.append(r)\ndel s.readings[:-3]\nx.approvals += [a]\ns.ramp_decisions[0] = d"))) == [1, 2, 3, 4]


# ---- the upkeep from the changed steps equals the upkeep over every step -------------------------------


def _edit(rng: random.Random, step: StepState, at: datetime) -> None:
    """One random change of a step, often to a value it had (so a change can be undone before anyone looks)."""
    match rng.randrange(11):
        case 0:
            step.status = rng.choice(["pending", "running", "held", "awaiting_approval", "succeeded", "failed"])
        case 1:
            step.attempts = rng.randrange(3)
        case 2:
            step.error = rng.choice([None, "e", "x" * 600, "x" * 599 + "y"])  # the last two cut alike
        case 3:
            step.add_reading(GateReading(gate="g", at=at, value=float(rng.randrange(2)), passed=rng.random() < 0.5), keep=3)
        case 4:
            step.add_approval(ApprovalRecord(step=step.id, approver="bob", at=at))
        case 5:
            step.percent, step.last_good = rng.choice([None, 10, 20]), rng.choice([None, 10])
        case 6:
            step.gate_gives_up_at = rng.choice([None, NOW])
        case 7:  # the next three are in the memo, not in the signature
            step.started_at = rng.choice([None, at])
        case 8:
            step.ended_at = rng.choice([None, at])
        case 9:
            step.title = rng.choice(["", "t"])
        case _:
            step.add_ramp_decision(RampDecision(at=10, next=20, step=10, reason="r"))


def _status(steps: dict[str, StepState], **run: Any) -> RunStatus:
    running = [s.id for s in steps.values() if s.status in ("running", "awaiting_approval", "held")]
    return RunStatus(workflow_id="w", runbook="r", target="t", initiator="i", drill=False, state="running",
                     started_at=NOW, steps=list(steps.values()), current_step=running[-1] if running else None,
                     held=[s.id for s in steps.values() if s.status == "held"], **run)


@pytest.mark.parametrize("chunk", [None, 5])
@pytest.mark.parametrize("budget", [128 * 1024, 6000])
def test_the_memo_from_the_changed_steps_is_the_memo_from_every_step(budget: int, chunk: int | None):
    rng = random.Random(7)
    steps = {f"s{i}": StepState(id=f"s{i}", kind="gate") for i in range(12)}
    changes = StepChanges(steps)
    changed, in_play = changes.reader(), StepsInPlay()
    whole, partial = StatusMemo(budget, chunk=chunk), StatusMemo(budget, chunk=chunk)
    memo: dict[str, Any] = {}
    rounds_changed = 0
    for round_no in range(400):
        for _ in range(rng.randrange(4)):
            _edit(rng, rng.choice(list(steps.values())), NOW + timedelta(seconds=round_no))
        error = rng.choice([None, "run error"])
        taken = changes.taken(changed)
        current, held = in_play.update(taken)
        expected = whole.changes(_status(steps, error=error))
        got = partial.changes_in(_status({}, error=error).model_copy(update={"current_step": current, "held": held}), taken)
        assert got == expected, round_no
        assert list(got) == list(expected)  # the same keys in the same order
        # What the server keeps, upsert after upsert (None removes a key), reads back as the status.
        memo = {key: value for key, value in {**memo, **got}.items() if value is not None}
        if not whole.full:
            assert status_from_memo(memo) == RunStatus.model_validate(status_from_memo(
                {key: value for key, value in StatusMemo(chunk=chunk).changes(_status(steps, error=error)).items()}
            ).model_dump()), round_no
        rounds_changed += bool(got)
        if budget < 10_000 and whole.full:
            break
    assert partial.full == whole.full == (budget < 10_000)
    assert rounds_changed > 10


def test_the_watch_sees_a_change_exactly_when_the_whole_signature_differs():
    rng = random.Random(11)
    steps = {f"s{i}": StepState(id=f"s{i}", kind="gate") for i in range(8)}
    run = {"state": "running"}

    def signature() -> tuple:
        steps_part = tuple(map(_SIGNED, steps.values()))
        readings = tuple(_LAST_READING(s.readings[-1]) for s in steps.values() if s.readings)
        return run["state"], steps_part, readings, tuple(len(s.approvals) for s in steps.values())

    watch = StatusWatch(StepChanges(steps), lambda s: (_SIGNED(s), _LAST_READING(s.readings[-1])
                                                      if s.readings else None, len(s.approvals)), lambda: run["state"])
    waiting: list[tuple[tuple, Any]] = []
    seen = {True: 0, False: 0}
    for round_no in range(600):
        if rng.random() < 0.3:
            waiting.append((signature(), watch.since()))
        for _ in range(rng.randrange(3)):
            _edit(rng, rng.choice(list(steps.values())), NOW)
        if rng.random() < 0.05:
            run["state"] = rng.choice(["running", "paused"])
        now = signature()
        for item in list(waiting):
            then, changed = item
            assert changed() == (now != then), round_no
            seen[now != then] += 1
            if now != then:  # a waiter that woke is done with its condition
                waiting.remove(item)
    assert seen[True] > 50 and seen[False] > 50


# ---- a run's upserts, replayed: the same as the whole upkeep's, in the same workflow tasks --------------

_RECORDS: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
_CHECKS = {True: 0, False: 0}


@workflow.defn(name="RunbookWorkflow", sandboxed=False)
class CheckedRunbook(RunbookWorkflow):
    """RunbookWorkflow with the whole upkeep checked beside its own, at the same instants: at each of its
    keeper's turns the whole status's changes are recorded beside what it upserts, and at each check of
    its condition the whole signature's comparison is recorded if it answers otherwise. (In a replay the
    notices watcher, the other caller of _status_since, is idle: no sink.)"""

    @workflow.run
    async def run(self, start: RunStart | dict[str, Any]) -> RunResult:
        return await super().run(start)

    def _status_since(self) -> Callable[[], bool]:
        since = super()._status_since()
        signature = whole_signature(self)
        if not hasattr(self, "_whole_memo"):
            self._whole_memo = StatusMemo(compact=True, chunk=MEMO_CHUNK)
        self._note_upkeep("whole", self._whole_memo.changes(self.status()))

        def changed() -> bool:
            woke, whole_woke = since(), whole_signature(self) != signature
            _CHECKS[woke == whole_woke] += 1
            if woke != whole_woke:
                self._note_upkeep("disagreed", {"woke": woke})
            return woke

        return changed

    def _upsert_status_memo(self, changed: dict[str, Any]) -> None:
        self._note_upkeep("changed", changed)
        super()._upsert_status_memo(changed)

    def _note_upkeep(self, upkeep: str, changed: dict[str, Any]) -> None:
        if changed:
            records = _RECORDS.setdefault(workflow.info().run_id, [])
            records.append((upkeep, workflow.info().get_current_history_length(), changed))


def _upserted(history: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """The memo upserts a history holds: (the history's length when the workflow task began, entries)."""
    upserts = []
    for event in history["events"]:
        if event["eventType"] == "EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED":
            attributes = event["workflowPropertiesModifiedEventAttributes"]
            fields = attributes["upsertedMemo"]["fields"]
            upserts.append((int(attributes["workflowTaskCompletedEventId"]) - 1,
                            {key: json.loads(base64.b64decode(payload["data"])) if "data" in payload else None  # None: removed
                             for key, payload in fields.items()}))
    return upserts


async def _replay_checked(history_json: str, workflow_id: str, *, recorded_here: bool) -> list[tuple[int, dict[str, Any]]]:
    """Replay a history with the whole upkeep checked beside the run's: the upserts both make, which must be
    the ones the history holds (the same workflow tasks and keys; and values, if this code `recorded_here`:
    older code kept fewer fields), and their conditions agreeing."""
    _RECORDS.clear()
    _CHECKS.update({True: 0, False: 0})
    history = WorkflowHistory.from_json(workflow_id, history_json)
    replayer = Replayer(workflows=[CheckedRunbook, FanOutWorkflow], data_converter=DATA_CONVERTER,
                        workflow_runner=UnsandboxedWorkflowRunner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    records = [record for records in _RECORDS.values() for record in records]
    changed = [(at, entries) for upkeep, at, entries in records if upkeep == "changed"]
    whole = [(at, entries) for upkeep, at, entries in records if upkeep == "whole"]
    assert [record for record in records if record[0] == "disagreed"] == [] and _CHECKS[False] == 0
    assert changed == whole
    held = _upserted(json.loads(history_json))
    if recorded_here:
        assert changed == held
    assert [(at, sorted(entries)) for at, entries in changed] == [(at, sorted(entries)) for at, entries in held]
    return changed


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replayed_runs_upsert_what_reading_every_step_upserts(path: Path):
    """Every recorded run keeps its status in its memo, and the paced view's upkeep replays as it ran."""
    upserts = await _replay_checked(path.read_text(), f"coldstart-replay-{path.stem}", recorded_here=False)
    assert upserts
    # A paced view waits on the conditions only between windows, where nothing changed.
    assert _CHECKS[True] >= 1


@pytest.fixture
async def prom():
    server = await support.ScriptedPrometheus().start()
    yield server
    await server.stop()


async def test_a_run_with_a_gate_an_approval_a_held_step_and_a_ramp_upserts_what_reading_every_step_upserts(
        env, task_queue, tmp_path, prom):
    out, flag = tmp_path / "out.txt", tmp_path / "fixed"
    prom.script("healthy", 0, 1, 1)
    prom.script("errors", 0, 0, 5, 0)  # the ramp: 10 and 20 pass, 30 fails (held), the fallback at 20 passes
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: upkeep}}
        target: t
        approvers: [bob]
        steps:
          - id: first
            action: test.append
            with: {{path: "{out}", label: first}}
          - id: healthy
            gate: {{endpoint: "{prom.url}", query: healthy, comparator: ">=", threshold: 1, interval: 0.1s, consecutive: 2,
                   timeout: 10s}}
          - id: ok
            approval: {{prompt: "go?"}}
          - id: flaky
            action: test.maybe_fail
            with: {{path: "{out}", label: flaky, fail_until_file_exists: "{flag}"}}
            on_failure: hold
          - id: ramp
            ramp:
              action: test.append
              with: {{path: "{out}", label: "ramp ${{{{ ramp.percent }}}}"}}
              start: 10
              stop: 40
              step: 10
              bake: 0.1s
              gates:
                - {{name: errors, endpoint: "{prom.url}", query: errors, comparator: "<", threshold: 1, interval: 1s,
                   timeout: 0.5s}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, target={"name": "upkeep-" + task_queue})
        await support.wait_for(lambda: _status_has(handle, lambda status: "ok" in status.awaiting_approval))
        await handle.execute_update("approve", ApproveRequest(step="ok", approver="bob"))
        await support.wait_for(lambda: _status_has(handle, lambda status: "flaky" in status.held))
        flag.touch()
        await handle.execute_update("retry", ControlRequest(step="flaky", actor="bob", reason="fixed"))
        await support.wait_for(lambda: _status_has(handle, lambda status: "ramp" in status.held))
        prom.script("errors", 0)
        await handle.execute_update("retry", ControlRequest(step="ramp", actor="bob", reason="fixed"))
        await handle.result()
        history = await handle.fetch_history()
        memo = await (await handle.describe()).memo()
    upserts = await _replay_checked(history.to_json(), handle.id, recorded_here=True)
    # A step in play has its own key, removed (upserted as None) once the step is done; the others share a
    # chunk. (A step in play within one VIEW_EVERY window, as `healthy` may be, never shows under its own key.)
    steps = {key for _, entries in upserts for key in entries}
    assert steps >= {f"coldstart.step.{step}" for step in ("ok", "flaky", "ramp")} | {"coldstart.steps.0"}
    assert sorted(memo) == ["coldstart.run", "coldstart.steps.0"]  # the server removed the steps' own keys
    assert [entry["id"] for entry in memo["coldstart.steps.0"]] == ["first", "healthy", "ok", "flaky", "ramp"]
    kept = status_from_memo(memo)
    assert kept is not None and [step.status for step in kept.steps] == ["succeeded"] * 5
    step_entries = [entry for _, entries in upserts for key, value in entries.items() if key != "coldstart.run"
                    for entry in (value if isinstance(value, list) else [value]) if entry is not None]
    assert any(entry.get("readings") for entry in step_entries) and any(entry.get("approvals") for entry in step_entries)
    # Paced (workflows/visibility.VIEW_EVERY): the changes within a window of the last upsert go out together.
    assert any(entry.get("status") == "held" for entry in step_entries) and len(upserts) >= 6


async def _status_has(handle: Any, test: Callable[[RunStatus], bool]) -> bool:
    """As an operator's live view sees the run: from its memo (paced: a state shorter than
    workflows/visibility.VIEW_EVERY may never show there)."""
    return test(await read_kept_status(handle))
