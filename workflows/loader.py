"""Reads a runbook file into a validated plan, reporting every error as file:line:col: message."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, assert_never

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from activities.contracts.telemetry import READ_ACTIONS, WAITED_IN_READING
from activities.errors import LocatedErrors
from activities.oidc import IDENTITY_KEYS_ACTION
from activities.policy import TargetPolicy
from activities.retry import format_duration, parse_duration
from workflows.contract import RunInput, RunRequest
from workflows.names import NameRefused, check_name, named_file
from workflows.refs import RefError, contains_refs, iter_refs, resolve, split_path
from workflows.spec import (
    STEP_KINDS,
    ActionDefaults,
    ActionStep,
    AnyStep,
    ApprovalStep,
    Finite,
    ForEachStep,
    GateSpec,
    GateStep,
    ParallelStep,
    Param,
    RampStep,
    Runbook,
    Step,
    WaitStep,
)
from workflows.yaml_safety import GuardedLoader, YamlRefused, as_refusal, check_text, load_file, read_text

if TYPE_CHECKING:
    from activities.inventory import Inventory

__all__ = [
    "InventoryInvalid", "LocatedSource", "RunbookInvalid", "load_inventory", "load_runbook", "locate_pydantic_errors",
    "parse_located_yaml", "pinned_defaults", "plan_run", "read_inventory", "runbook_digest",
]

_PARAM_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": Finite,  # not NaN or an infinity: a threshold or a limit it becomes would compare as no bound
    "boolean": bool,
    "list": list,
    "object": dict,
}
_PLACEHOLDERS: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0.0,
    "boolean": False,
    "list": [],
    "object": {},
    "duration": 0,
}
_RUNTIME_ROOTS = {"steps", "run", "ramp"}
_START_ROOTS = {"params", "target"}


class RunbookInvalid(LocatedErrors):
    """Every problem found in a runbook, one `file:line:col: message` line each."""


Path_ = tuple[Any, ...]


@dataclass
class LocatedSource:
    """A YAML file being checked: its data, where each value and key sits, and the problems found, with their places."""

    file: str
    data: Any = None
    values: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    errors: list[tuple[tuple[int, int], str]] = field(default_factory=list)
    notes: list[tuple[tuple[int, int], str]] = field(default_factory=list)  # worth saying, not wrong
    text: str = ""

    def at(self, path: Path_, *, key: bool = False) -> tuple[int, int]:
        path = tuple(path)
        while True:
            if key and path in self.keys:
                return self.keys[path]
            if path in self.values:
                return self.values[path]
            if not path:
                return (1, 1)
            path = path[:-1]

    def error(self, path: Path_, message: str, *, key: bool = False) -> None:
        self.errors.append((self.at(path, key=key), message))

    def error_at(self, line_col: tuple[int, int], message: str) -> None:
        self.errors.append((line_col, message))

    def note(self, path: Path_, message: str) -> None:
        self.notes.append((self.at(path), message))

    def formatted(self, entries: list[tuple[tuple[int, int], str]] | None = None, prefix: str = "") -> list[str]:
        # One message per location: union branches otherwise repeat the same problem.
        seen: set[tuple[int, int]] = set()
        lines = []
        for (line, col), message in sorted(self.errors if entries is None else entries, key=lambda e: e[0]):
            if (line, col) not in seen:
                seen.add((line, col))
                lines.append(f"{self.file}:{line}:{col}: {prefix}{' '.join(str(message).split())}")
        return lines


def _mark(mark: yaml.Mark) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def parse_located_yaml(text: str, source: LocatedSource) -> None:
    try:
        loader = GuardedLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                source.error_at((1, 1), "the file is empty")
                return
            source.data = _convert(loader, node, (), source)
        except yaml.YAMLError as exc:
            raise as_refusal(exc, text) from None
        finally:
            loader.dispose()
    except YamlRefused as exc:
        source.error_at((exc.line, exc.column), exc.message)


def _convert(loader: GuardedLoader, node: yaml.Node, path: Path_, source: LocatedSource) -> Any:
    source.values[path] = _mark(node.start_mark)
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        written: set[Any] = set()
        for key_node, value_node, own in loader.mapping_items(node):
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                source.error_at(_mark(key_node.start_mark), "a mapping key must be a plain scalar")
                continue
            if own:  # a key from a `<<` merge may be overridden, one written twice may not
                if key in written:
                    source.error_at(_mark(key_node.start_mark), f"duplicate key {key!r}")
                    continue
                written.add(key)
            source.keys[path + (key,)] = _mark(key_node.start_mark)
            result[key] = _convert(loader, value_node, path + (key,), source)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, path + (i,), source) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def locate_pydantic_errors(exc: ValidationError, source: LocatedSource, base: Path_, data: Any) -> None:
    for err in exc.errors(include_url=False):
        path = _loc_to_path(err["loc"], data)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = f"unknown field {str(err['loc'][-1])!r}"
            source.error(base + path, message, key=True)
            continue
        if err["type"] == "missing":
            message = f"missing required field {str(err['loc'][-1])!r}"
            path = path[:-1] if path and path[-1] == err["loc"][-1] else path
        elif path:
            message = f"{_describe(path)}: {message}"
        source.error(base + path, message)


def _describe(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _loc_to_path(loc: Iterable[Any], data: Any) -> Path_:
    """Map a pydantic error location onto the YAML path, dropping union tags."""
    path: list[Any] = []
    current = data
    for part in loc:
        if isinstance(current, dict) and part in current or isinstance(current, list) and isinstance(part, int) and part < len(current):
            path.append(part)
            current = current[part]
        elif part in STEP_KINDS or isinstance(part, str) and (
            part in ("int", "str", "float", "bool", "list", "dict", "none") or "-" in part or "[" in part
        ):
            continue  # union branch and validator tags, not places in the file
        else:
            path.append(part)
            break
    return tuple(path)


class InventoryInvalid(LocatedErrors):
    """A target file that reads as YAML but breaks the inventory contract; every problem `file:line:col: message`."""


def read_inventory(path: str | Path, *, default_name: str | None = None) -> Inventory:
    """Read and validate a target file against the inventory contract (activities/inventory.py).

    A hostile file is refused by the guarded reader (YamlRefused); a well-formed one that breaks the
    contract raises InventoryInvalid with each problem located where the file says it.
    """
    # The inventory's models (every target kind an action takes) load only when a target is read.
    from activities.inventory import Inventory

    data = load_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise YamlRefused(1, 1, "an inventory must be a mapping", str(path))
    if default_name is not None:
        data.setdefault("name", default_name)
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        # Positions are only needed to report, so the file is walked for them only now.
        source = LocatedSource(file=str(path))
        parse_located_yaml(read_text(str(path)), source)
        locate_pydantic_errors(exc, source, (), data)
        raise InventoryInvalid(source.formatted()) from None


def load_inventory(name: str, targets_dir: Path) -> Inventory:
    """targets_dir/NAME.yaml, validated (read_inventory); its `name:` defaults to NAME. A NAME that is no target
    name (workflows/names.py) is refused (NameRefused) before any file is looked at."""
    path = named_file(targets_dir, "target", name)
    if not path.exists():
        raise FileNotFoundError(f"no inventory for target {name!r} (looked for {path}; $COLDSTART_TARGETS names "
                                f"the inventories' directory, now {str(targets_dir)!r})")
    return read_inventory(path, default_name=name)


def _read_source(file: str, text: str | None) -> LocatedSource:
    source = LocatedSource(file=file)
    try:
        text = read_text(file) if text is None else check_text(text)
    except OSError as exc:
        raise RunbookInvalid([f"{file}:1:1: cannot read: {exc.strerror or exc}"]) from None
    except YamlRefused as exc:
        raise RunbookInvalid([exc.located(file)]) from None
    source.text = text
    parse_located_yaml(text, source)
    if source.errors:
        raise RunbookInvalid(source.formatted())
    if not isinstance(source.data, dict):
        raise RunbookInvalid([f"{file}:1:1: a runbook is a mapping with metadata, target and steps"])
    return source


def load_runbook(file: str | Path, text: str | None = None) -> Runbook:
    """Parse and type-check a runbook file with its parameter defaults (no semantic checks)."""
    source = _read_source(str(file), text)
    try:
        return Runbook.model_validate(source.data)
    except ValidationError as exc:
        locate_pydantic_errors(exc, source, (), source.data)
        raise RunbookInvalid(source.formatted()) from None


def _coerce_params(
    declared: dict[str, Param], given: dict[str, Any], source: LocatedSource, *, placeholders: bool
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in given:
        if name not in declared:
            source.error(("params",), f"unknown parameter {name!r} given (declared: {', '.join(declared) or 'none'})")
    for name, param in declared.items():
        if name in given:
            raw, where = given[name], f"parameter {name!r} (given)"
        elif param.default is not None:
            raw, where = param.default, f"parameter {name!r} default"
        elif placeholders:
            continue  # validating without a value: references to it stay unresolved, like runtime ones
        else:
            source.error(("params", name), f"parameter {name!r} is required and has no default")
            continue
        try:
            if param.type == "duration":
                duration = parse_duration(raw)
                values[name] = duration.total_seconds() if hasattr(duration, "total_seconds") else float(raw)
            else:
                values[name] = TypeAdapter(_PARAM_TYPES[param.type]).validate_python(
                    raw, strict=False
                )
        except ValidationError as exc:
            source.error(("params", name), f"{where}: expected {param.type}: {exc.errors()[0]['msg']}")
        except (ValueError, TypeError) as exc:
            source.error(("params", name), f"{where}: expected {param.type}: {exc}".splitlines()[0])
    return values


def plan_run(
    file: str | Path,
    *,
    registry: Any,
    params: dict[str, Any] | None = None,
    inventory: dict[str, Any] | None = None,
    targets_dir: Path | None = None,
    initiator: str = "unknown",
    drill: bool = False,
    placeholders: bool = False,
    text: str | None = None,
    notes: list[str] | None = None,
) -> RunInput:
    """Validate a runbook completely and return the workflow input, or raise RunbookInvalid.

    Parameters and target references are resolved here, before anything starts; step
    outputs resolve inside the workflow as steps complete. notes: gets a file:line:col line for
    each thing worth saying that is not an error (a gate interval under a second).
    """
    source = _read_source(str(file), text)
    try:
        declared = TypeAdapter(dict[str, Param]).validate_python(source.data.get("params") or {})
    except ValidationError as exc:
        locate_pydantic_errors(exc, source, ("params",), source.data.get("params"))
        raise RunbookInvalid(source.formatted()) from None
    param_values = _coerce_params(declared, params or {}, source, placeholders=placeholders)
    target_name = source.data.get("target") if isinstance(source.data.get("target"), str) else None
    if inventory is None and targets_dir is not None:
        try:
            inventory = load_inventory(target_name or "", targets_dir).as_target()
        except (OSError, ValueError, yaml.YAMLError) as exc:
            source.error(("target",), str(exc).splitlines()[0])
    context = {"params": param_values, "target": inventory or {}}
    if inventory is not None:
        _check_choices(declared, param_values, context, source)

    # Resolve start-time references in the raw YAML data, so locations stay exact.
    unset = {n for n in declared if n not in param_values} if placeholders else None
    resolved_data = _resolve_start_refs(source.data, context, source, check_target=inventory is not None, lenient_params=unset)
    try:
        runbook = Runbook.model_validate(resolved_data)
    except ValidationError as exc:
        locate_pydantic_errors(exc, source, (), resolved_data)
        _check_semantics(*_valid_parts(resolved_data), source, registry, check_target=inventory is not None)
        raise RunbookInvalid(source.formatted()) from None

    on_miss = runbook.deadline.on_miss if runbook.deadline else []
    actions = _check_semantics(runbook.steps, runbook.approvers, source, registry, check_target=inventory is not None,
                               on_miss=on_miss)
    _check_deadlines(runbook, source)
    _check_deadline_ahead(runbook, source)
    _check_objectives(runbook, source)
    _check_access(runbook, source, registry, actions, inventory)
    _pin_gate_reads(runbook, source, registry, actions)
    if source.errors:
        raise RunbookInvalid(source.formatted())
    if notes is not None:
        _note_fast_gates(runbook, source)
        notes.extend(source.formatted(source.notes, prefix="note: "))
    target = inventory or {"name": runbook.target}
    target_name = (inventory or {}).get("name", runbook.target)
    try:
        check_name("target", target_name)
    except NameRefused as exc:
        source.error(("target",), str(exc))
        raise RunbookInvalid(source.formatted()) from None
    return RunInput(
        runbook=runbook,
        source=str(file),
        params=param_values,
        target=target,
        target_name=target_name,
        initiator=initiator,
        drill=drill,
        actions=actions,
        request=RunRequest(runbook=runbook.metadata.name, digest=runbook_digest(source.text), text=source.text,
                           source=str(file), target=target_name, inventory=target, params=dict(params or {}),
                           initiator=initiator, drill=drill),
    )


def runbook_digest(text: str) -> str:
    """A runbook version: the sha256 of its file's text, as `sha256:<hex>`."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _resolve_start_refs(
    data: Any, context: dict[str, Any], source: LocatedSource, *, check_target: bool, lenient_params: set[str] | None = None
) -> Any:
    def walk(value: Any, path: Path_) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path + (i,)) for i, v in enumerate(value)]
        if isinstance(value, str) and contains_refs(value):
            for ref in iter_refs(value):
                try:
                    split_path(ref)
                except RefError as exc:
                    source.error(path, str(exc))
                    return value
            try:
                return resolve(value, context, only=_START_ROOTS if check_target else {"params"})
            except RefError as exc:
                named = {str(p[1]) for p in map(split_path, iter_refs(value)) if p[0] == "params" and len(p) > 1}
                if lenient_params and named & lenient_params:
                    return value  # validating without a value for these parameters
                source.error(path, f"reference does not resolve: {exc}")
        return value

    return walk(data, ())


@dataclass
class _Scope:
    """What a step may refer to: steps already finished and the loop variables around it."""

    done: set[str]
    later: set[str]
    siblings: set[str]
    loop_vars: set[str]


def _check_semantics(
    steps_in: list[Any], approvers: list[str], source: LocatedSource, registry: Any, *, check_target: bool = True,
    on_miss: list[Any] = (),  # type: ignore[assignment]
) -> dict[str, ActionDefaults]:
    """Checks across steps. `steps_in` may hold None for steps that failed type checks, so that
    the remaining ones are still checked and every error is reported in one pass."""
    ids: dict[str, Path_] = {}
    kinds: dict[str, Any] = {}
    actions: dict[str, ActionDefaults] = {}

    def collect(steps: list[Any], base: Path_) -> None:
        for i, step in enumerate(steps):
            if step is None:
                continue
            path = base + (i,)
            if step.id in ids:
                first = source.at(ids[step.id] + ("id",))
                source.error(path + ("id",), f"duplicate step id {step.id!r} (first defined at line {first[0]})")
            else:
                ids[step.id] = path
                kinds[step.id] = step
            if isinstance(step, ParallelStep):
                collect(step.parallel, path + ("parallel",))

    collect(steps_in, ("steps",))
    collect(on_miss, ("deadline", "on_miss"))
    all_ids = set(ids)

    def use_action(name: str, args: dict[str, Any], path: Path_, scope: _Scope) -> None:
        spec = registry.get(name)
        if spec is None:
            close = [n for n in registry.names() if n.split(".")[0] == name.split(".")[0]]
            hint = f" (known: {', '.join(close)})" if close else ""
            source.error(path, f"unknown action {name!r}{hint}")
            return
        actions[name] = pinned_defaults(spec)
        undo = registry.get(spec.undo) if spec.undo else None
        if undo is not None:
            actions[spec.undo] = pinned_defaults(undo)
        _check_args(spec.input_model, args, path[:-1] + ("with",), source, name)

    def check_refs(value: Any, path: Path_, scope: _Scope) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                check_refs(v, path + (k,), scope)
            return
        if isinstance(value, list):
            for i, v in enumerate(value):
                check_refs(v, path + (i,), scope)
            return
        for ref in iter_refs(value):
            try:
                parts = split_path(ref)
            except RefError as exc:
                source.error(path, str(exc))
                continue
            root = parts[0]
            if root == "steps":
                if len(parts) < 2:
                    source.error(path, f"reference {ref!r} names no step")
                    continue
                target = str(parts[1])
                if target not in all_ids:
                    source.error(path, f"reference {ref!r}: no step {target!r}")
                elif target in scope.siblings:
                    source.error(path, f"reference {ref!r}: step {target!r} runs in parallel with this one")
                elif target in scope.later:
                    source.error(path, f"reference cycle: {ref!r} refers to step {target!r}, which runs after this one")
                elif target not in scope.done:
                    source.error(path, f"reference cycle: {ref!r} refers to the step it is used in")
                elif len(parts) >= 4 and parts[2] == "outputs":
                    _check_output(kinds[target], str(parts[3]), ref, path, source, registry)
                elif len(parts) >= 3 and parts[2] not in ("outputs", "status"):
                    source.error(path, f"reference {ref!r}: a step has 'outputs' and 'status'")
            elif root in ("ramp", "run") or root in scope.loop_vars:
                if root == "ramp" and "ramp" not in scope.loop_vars:
                    source.error(path, f"reference {ref!r}: 'ramp' is only defined inside a ramp")
                elif root == "ramp" and parts[1:] not in (["percent"], ["previous"]):
                    source.error(path, f"reference {ref!r}: a ramp has 'percent' and 'previous'")
                elif root == "run" and (len(parts) != 2 or parts[1] not in ("id", "initiator", "target", "runbook", "drill")):
                    source.error(path, f"reference {ref!r}: run has id, initiator, target, runbook, drill")
            elif root in ("params", "target"):
                continue  # resolved before this pass, or already reported (or no inventory was given)
            else:
                source.error(path, f"reference {ref!r}: unknown root {root!r} (use params, target, steps, run)")

    def walk(
        steps: list[AnyStep | None],
        base: Path_,
        done: set[str],
        later_outer: set[str],
        loop_vars: set[str],
        siblings: set[str] = frozenset(),  # type: ignore[assignment]
        offset: int = 0,
    ) -> None:
        done = set(done)
        for i, step in enumerate(steps):
            if step is None:
                continue
            path = base + (i + offset,)
            later = {s.id for s in steps[i + 1 :] if s is not None} | later_outer
            scope = _Scope(done=done, later=later, siblings=set(siblings), loop_vars=loop_vars)
            if isinstance(step, ActionStep):
                use_action(step.action, step.with_, path + ("action",), scope)
                check_refs(step.with_, path + ("with",), scope)
                if step.undo:
                    use_action(step.undo.action, step.undo.with_, path + ("undo", "action"), scope)
                    undo_scope = _Scope(done=done | {step.id}, later=later, siblings=set(siblings), loop_vars=loop_vars)
                    check_refs(step.undo.with_, path + ("undo", "with"), undo_scope)
            elif isinstance(step, GateStep):
                check_refs(step.gate.model_dump(by_alias=True), path + ("gate",), scope)
            elif isinstance(step, ApprovalStep):
                check_refs(step.approval.prompt, path + ("approval", "prompt"), scope)
            elif isinstance(step, RampStep):
                ramp_scope = _Scope(done=done, later=later, siblings=set(siblings), loop_vars=loop_vars | {"ramp"})
                use_action(step.ramp.action, step.ramp.with_, path + ("ramp", "action"), ramp_scope)
                check_refs(step.ramp.with_, path + ("ramp", "with"), ramp_scope)
                for g, gate in enumerate(step.ramp.gates):
                    check_refs(gate.model_dump(by_alias=True), path + ("ramp", "gates", g), ramp_scope)
                if step.ramp.approval:
                    check_refs(step.ramp.approval.prompt, path + ("ramp", "approval", "prompt"), ramp_scope)
            elif isinstance(step, ForEachStep):
                spec = step.for_each
                check_refs(spec.items, path + ("for_each", "items"), scope)
                if isinstance(spec.items, str) and not contains_refs(spec.items):
                    source.error(path + ("for_each", "items"), "items must be a list or a ${{ }} reference to one")
                item_scope = _Scope(done=done, later=later, siblings=set(siblings), loop_vars=loop_vars | {spec.as_})
                use_action(spec.action, spec.with_, path + ("for_each", "action"), item_scope)
                check_refs(spec.with_, path + ("for_each", "with"), item_scope)
            elif isinstance(step, ParallelStep):
                members = _ids_in(step.parallel)
                for j, child in enumerate(step.parallel):
                    # Siblings may not refer to each other: they run at the same time.
                    walk([child], path + ("parallel",), done, later, loop_vars, members - _ids_in([child]), j)
                done |= members
            elif isinstance(step, WaitStep):
                pass  # a duration, already resolved: no reference or action left to check
            else:
                assert_never(step)
            done.add(step.id)

    walk(steps_in, ("steps",), set(), set(), set())
    # on_miss steps may run after any step, finished or not: they can refer to none of them.
    walk(on_miss, ("deadline", "on_miss"), set(), _ids_in([s for s in steps_in if s is not None]), set())

    for name in approvers:
        if not name.strip():
            source.error(("approvers",), "an approver name cannot be empty")
    return actions


def _check_choices(declared: dict[str, Param], values: dict[str, Any], context: dict[str, Any], source: LocatedSource) -> None:
    """A parameter with `one_of` takes only those values; a target reference allows the names it holds."""
    for name, param in declared.items():
        if param.one_of is None or name not in values:
            continue
        allowed = param.one_of
        if isinstance(allowed, str):
            try:
                found = resolve(allowed, context, only={"target"})
            except RefError as exc:
                source.error(("params", name, "one_of"), f"parameter {name!r}: one_of does not resolve: {exc}")
                continue
            if isinstance(found, dict):
                allowed = list(found)
            elif isinstance(found, list):
                allowed = [item.get("name") if isinstance(item, dict) else item for item in found]
            else:
                allowed = [found]
        elif isinstance(allowed, dict):
            allowed = list(allowed)  # a mapping allows its keys, as a reference to one does
        if values[name] not in allowed:
            shown = ", ".join(map(str, allowed[:10])) + (f" and {len(allowed) - 10} more" if len(allowed) > 10 else "")
            source.error(("params", name), f"parameter {name!r}: {values[name]!r} is not one of {shown or 'nothing'}")


def _check_deadline_ahead(runbook: Runbook, source: LocatedSource) -> None:
    """A deadline with `max_ahead` must still be ahead, and not further than that, when the run is planned."""
    spec = runbook.deadline
    if spec is None or spec.max_ahead is None or not isinstance(spec.at, datetime):
        return
    ahead = spec.at - datetime.now(UTC)
    if ahead <= timedelta(0):
        source.error(("deadline", "at"), f"the deadline {spec.at.isoformat()} is already "
                                         f"{format_duration(round(-ahead.total_seconds()))} past: nothing is started")
    elif ahead > spec.max_ahead:
        source.error(("deadline", "at"), f"the deadline {spec.at.isoformat()} is {format_duration(round(ahead.total_seconds()))} "
                                         f"ahead, more than max_ahead ({format_duration(spec.max_ahead)}): nothing is started")


def _check_objectives(runbook: Runbook, source: LocatedSource) -> None:
    """Each phase ends at a top-level step, after the phase before it ends."""
    if runbook.objectives is None:
        return
    order = {step.id: i for i, step in enumerate(runbook.steps)}
    previous: tuple[str, int] | None = None
    for name, phase in runbook.objectives.phases.items():
        where = ("objectives", "phases", name, "until")
        if phase.until not in order:
            source.error(where, f"phase {name}: until {phase.until!r} is not one of the runbook's top-level steps")
            continue
        if previous is not None and order[phase.until] <= previous[1]:
            source.error(where, f"phase {name}: until {phase.until!r} does not come after {previous[0]}'s end; "
                                "phases are consecutive, in step order")
        previous = (name, order[phase.until])


def _check_deadlines(runbook: Runbook, source: LocatedSource) -> None:
    """A step's `needs` only means something under a deadline, and must fit inside its own."""
    bound = runbook.deadline is not None

    def walk(steps: list[Any], base: Path_, bound: bool) -> None:
        for i, step in enumerate(steps):
            path = base + (i,)
            if step.needs is not None and not (bound or step.deadline is not None):
                source.error(path + ("needs",), f"step {step.id}: `needs` without a deadline (set the step's "
                                                "`deadline` or the runbook's)")
            if step.needs is not None and step.deadline is not None and step.needs >= step.deadline:
                source.error(path + ("needs",), f"step {step.id}: needs {format_duration(step.needs)} but its deadline "
                                                f"is {format_duration(step.deadline)}")
            if isinstance(step, ParallelStep):
                walk(step.parallel, path + ("parallel",), bound or step.deadline is not None)

    walk(runbook.steps, ("steps",), bound)
    after = runbook.deadline.on_miss_after if runbook.deadline else None
    if after is not None and after not in {step.id for step in runbook.steps}:
        source.error(("deadline", "on_miss_after"), f"on_miss_after: {after!r} is not a step of the runbook's own "
                                                     "(top-level) steps")
    for i, step in enumerate(runbook.deadline.on_miss if runbook.deadline else []):
        if step.deadline is not None or step.needs is not None:
            source.error(("deadline", "on_miss", i), f"step {step.id}: on_miss steps run after the deadline; "
                                                      "they take no `deadline` or `needs`")


def _pin_gate_reads(runbook: Runbook, source: LocatedSource, registry: Any, actions: dict[str, ActionDefaults]) -> None:
    """Gates read their samples through telemetry.read_many (telemetry.read in runs from before it):
    pinned like any action when the runbook has a gate."""
    path = next((where for where, _, _ in _gates(runbook.steps, ("steps",))), None)
    if path is None:
        return
    for name in READ_ACTIONS:
        spec = registry.get(name)
        if spec is None:
            source.error(path, f"gates read through the {name} action, which this worker lacks")
            return
        actions[spec.name] = pinned_defaults(spec)


def _note_fast_gates(runbook: Runbook, source: LocatedSource) -> None:
    """A gate's sub-second interval is waited by the worker, not on a Temporal timer (which fires one
    about a second late), and readings go no faster than the worker's pace: say so
    where such an interval is written."""
    on_miss = runbook.deadline.on_miss if runbook.deadline else []
    for steps, base in ((runbook.steps, ("steps",)), (on_miss, ("deadline", "on_miss"))):
        for _, step, gates in _gates(steps, base):
            for path, gate in gates:
                if gate.interval < WAITED_IN_READING:
                    source.note(path + ("interval",), f"step {step.id}: gate interval {format_duration(gate.interval)} "
                                                      "is under a second; the worker waits it, and reads no faster than "
                                                      "its pace ($COLDSTART_READINGS_PER_SECOND, shared by every gate)")


def _gates(steps: list[Any], base: Path_) -> Iterable[tuple[Path_, Any, list[tuple[Path_, GateSpec]]]]:
    """Each step with gates, depth first through parallel groups: where its gates are written, the
    step, and each gate with its own path."""
    for i, step in enumerate(steps):
        if isinstance(step, GateStep):
            yield base + (i, "gate"), step, [(base + (i, "gate"), step.gate)]
        elif isinstance(step, RampStep) and step.ramp.gates:
            where = base + (i, "ramp", "gates")
            yield where, step, [(where + (k,), gate) for k, gate in enumerate(step.ramp.gates)]
        elif isinstance(step, ParallelStep):
            yield from _gates(step.parallel, base + (i, "parallel"))


def _check_access(runbook: Runbook, source: LocatedSource, registry: Any, actions: dict[str, ActionDefaults],
                  inventory: dict[str, Any] | None) -> None:
    """Who may act: names are non-empty and unique; verified identity (the runbook's or the target's) pins the
    action capturing its keys."""
    for i, name in enumerate(runbook.operators):
        if not name.strip():
            source.error(("operators", i), "an operator name cannot be empty")
    try:
        held = TargetPolicy.of(inventory or {}).identity
    except ValidationError:
        held = None  # the catalog refuses a malformed policy with its own message
    if runbook.identity is None and held is None:
        return
    spec = registry.get(IDENTITY_KEYS_ACTION)
    if spec is None:
        source.error(("identity",), f"verified identity needs the {IDENTITY_KEYS_ACTION} action, which this worker lacks")
        return
    actions[spec.name] = pinned_defaults(spec)
    if runbook.identity is None:
        return
    if "approve" in runbook.identity.controls and not runbook.approvers and not _step_approvers(runbook.steps):
        source.error(("identity", "controls"), "verified approvals need approvers: name them in `approvers:`")


def _step_approvers(steps: list[Any]) -> bool:
    for step in steps:
        spec = getattr(step, "approval", None) or getattr(getattr(step, "ramp", None), "approval", None)
        if spec is not None and spec.approvers:
            return True
        if isinstance(step, ParallelStep) and _step_approvers(step.parallel):
            return True
    return False


def pinned_defaults(spec: Any) -> ActionDefaults:
    """The registry's defaults for one action, as they will travel in the run input: ActionDefaults names the
    fields, the registry's ActionSpec holds them (tests/test_registry.py keeps the two in step)."""
    return ActionDefaults.model_validate({name: getattr(spec, name) for name in ActionDefaults.model_fields})


def _valid_parts(data: Any) -> tuple[list[Any], list[str]]:
    """The steps that type-check on their own (None for the others), for a second pass of checks."""
    raw_steps = data.get("steps") if isinstance(data, dict) else None
    adapter = TypeAdapter(Step)
    steps: list[Any] = []
    for raw in raw_steps if isinstance(raw_steps, list) else []:
        try:
            steps.append(adapter.validate_python(raw))
        except ValidationError:
            steps.append(None)
    approvers = data.get("approvers") if isinstance(data, dict) else None
    return steps, [a for a in approvers if isinstance(a, str)] if isinstance(approvers, list) else []


def _ids_in(steps: list[Any]) -> set[str]:
    found: set[str] = set()
    for step in steps:
        found.add(step.id)
        if isinstance(step, ParallelStep):
            found |= _ids_in(step.parallel)
    return found


def _check_output(step: Any, name: str, ref: str, path: Path_, source: LocatedSource, registry: Any) -> None:
    if isinstance(step, ActionStep):
        spec = registry.get(step.action)
        if spec is not None and spec.output_model is not None and name not in _field_names(spec.output_model):
            fields = ", ".join(sorted(_field_names(spec.output_model))) or "none"
            source.error(path, f"reference {ref!r}: action {step.action} has no output {name!r} (outputs: {fields})")


def _field_names(model: type[BaseModel]) -> set[str]:
    names = set()
    for field_name, info in model.model_fields.items():
        names.add(info.alias or field_name)
    return names


def _check_args(model: type[BaseModel], args: dict[str, Any], path: Path_, source: LocatedSource, action: str) -> None:
    if not isinstance(args, dict):
        source.error(path, f"'with' of {action} must be a mapping")
        return
    fields = {(info.alias or name): (name, info) for name, info in model.model_fields.items()}
    for key in args:
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            source.error(path + (key,), f"unknown argument {key!r} for action {action} (takes: {known})", key=True)
    for key, (_, info) in fields.items():
        if key not in args and info.is_required():
            source.error(path, f"action {action} needs argument {key!r}")
    if any(contains_refs(v) for v in args.values()):
        for key, value in args.items():
            if key not in fields or contains_refs(value):
                continue
            _, info = fields[key]
            try:
                # The field's type, built at run time from its annotation and metadata as pydantic reads them.
                field_type = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
                TypeAdapter(field_type).validate_python(value)  # pyright: ignore[reportArgumentType]
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                source.error(path + (key,), f"argument {key!r} of {action}: {first['msg']}")
        return
    known_args = {k: v for k, v in args.items() if k in fields}
    try:
        model.model_validate(known_args)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            if err["type"] == "missing":
                continue  # reported above with a clearer message
            loc = tuple(err["loc"])
            source.error(path + loc[:1], f"argument {_describe(loc)} of {action}: {err['msg']}")
