"""The action reference: what every action a runbook step may call takes, returns and undoes.

Everything is read from the registry and the actions' pydantic models (their JSON schemas, $refs
resolved), so the reference cannot say other than the validator: `coldstart actions [NAME]` shows it,
`coldstart actions --markdown > docs/actions.md` writes the page.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from activities.errors import InvalidInput
from activities.registry import ActionSpec, Registry
from activities.retry import Duration, Retry, format_duration

__all__ = ["ActionDoc", "FieldDoc", "ModelDoc", "UnknownAction", "describe", "describe_action",
           "lookup", "render_one", "render_table", "suggest", "to_markdown"]

COMMAND = "coldstart actions --markdown > docs/actions.md"

# The JSON schema's string formats, as the reference names them.
_FORMATS = {"date-time": "datetime", "date": "date", "time": "time", "duration": "duration", "uri": "url",
            "ipv4": "ipv4", "ipv6": "ipv6", "hostname": "dns name", "email": "email", "uuid": "uuid",
            "binary": "bytes", "base64": "base64", "path": "path"}
_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
# A Duration (activities/retry.py) is a number of seconds or a string such as 1h30m: one type to a runbook.
_DURATION_ANY_OF = TypeAdapter(Duration).json_schema()["anyOf"]
_TIMEDELTA = TypeAdapter(timedelta)


class FieldDoc(BaseModel):
    """One field of an input or output model (or of a model nested in one)."""

    name: str
    type: str
    required: bool
    has_default: bool
    default: Any = None
    limits: list[str] = []
    description: str = ""


class ModelDoc(BaseModel):
    """A model that a field's type names (ConsulTarget, KvEntry, ...), with its own fields."""

    name: str
    description: str = ""
    fields: list[FieldDoc]


class ActionDoc(BaseModel):
    name: str
    summary: str
    description: str
    mutating: bool
    undo: str | None
    # The output field handed to the undo action as its whole input (None: the step's own arguments).
    undo_from_output: str | None
    timeout: str
    heartbeat: str | None
    # The action's retry policy, as a step's `retry:` would write it (durations as 30s).
    retry: dict[str, Any]
    input_model: str
    inputs: list[FieldDoc]
    input_types: list[ModelDoc]
    output_model: str | None
    outputs: list[FieldDoc]
    output_types: list[ModelDoc]


class UnknownAction(InvalidInput, LookupError):
    """No action (nor namespace) by that name; the message suggests the nearest."""


def _retry_fields(retry: Retry) -> dict[str, Any]:
    """A retry policy field by field, as a step's `retry:` writes it."""
    values = {name: getattr(retry, name) for name in type(retry).model_fields}
    return {name: format_duration(v) if isinstance(v, timedelta) else v for name, v in values.items()}


def describe(registry: Registry) -> list[ActionDoc]:
    """Every registered action's reference, by name."""
    return [describe_action(registry.specs[name]) for name in registry.names()]


def describe_action(spec: ActionSpec) -> ActionDoc:
    doc = _paragraphs(spec.doc) or spec.description
    inputs = _Schema(spec.input_model, "validation")
    # Outputs are read as the step stored them (JSON), so their serialization schema is what refs see.
    outputs = _Schema(spec.output_model, "serialization") if spec.output_model is not None else None
    return ActionDoc(
        name=spec.name,
        summary=spec.summary or doc.split("\n\n")[0],
        description=doc,
        mutating=spec.mutating,
        undo=spec.undo,
        undo_from_output=spec.undo_from_output,
        timeout=format_duration(spec.timeout),
        heartbeat=format_duration(spec.heartbeat) if spec.heartbeat is not None else None,
        retry=_retry_fields(spec.retry),
        input_model=spec.input_model.__name__,
        inputs=inputs.fields(),
        input_types=inputs.models(),
        output_model=spec.output_model.__name__ if spec.output_model is not None else None,
        outputs=outputs.fields() if outputs else [],
        output_types=outputs.models() if outputs else [],
    )


class _FactoryDefaults(GenerateJsonSchema):
    """The JSON schema with the defaults of fields that have a default factory (`servers: []`), not just the
    static ones: a runbook author sees what leaving the field out means."""

    def get_default_value(self, schema: Any) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            try:
                return factory()
            except Exception:  # noqa: BLE001 - a factory that needs context: no default shown
                return NoDefault
        return super().get_default_value(schema)


class _Schema:
    """A model's JSON schema, read as the reference needs it: fields, readable types, limits, nested models."""

    def __init__(self, model: type[BaseModel], mode: str):
        self.root = model.model_json_schema(mode=mode, schema_generator=_FactoryDefaults)  # type: ignore[arg-type]
        self.defs: dict[str, dict[str, Any]] = self.root.get("$defs", {})
        titles = Counter(d.get("title", key) for key, d in self.defs.items())
        # A model's class name, unless two nested models share it (then pydantic's unique $defs key).
        self.names = {key: d.get("title", key) if titles[d.get("title", key)] == 1 else key
                      for key, d in self.defs.items()}

    def _target(self, ref: str) -> tuple[str, dict[str, Any]]:
        key = ref.rsplit("/", 1)[-1]
        return key, self.defs.get(key, {})

    def _model_ref(self, node: dict[str, Any]) -> str | None:
        """The $defs key of the model `node` is (or is `None | ` of), else None."""
        if "$ref" in node:
            key, target = self._target(node["$ref"])
            return key if "properties" in target else None
        branches = [b for b in node.get("anyOf", node.get("allOf", [])) if b.get("type") != "null"]
        return self._model_ref(branches[0]) if len(branches) == 1 else None

    def type_of(self, node: dict[str, Any]) -> str:
        if node.get("anyOf") == _DURATION_ANY_OF:
            return "duration"
        if "$ref" in node:
            key, target = self._target(node["$ref"])
            return self.names.get(key, key) if "properties" in target else self.type_of(target)
        if "const" in node:
            return json.dumps(node["const"])
        if "enum" in node:
            return " | ".join(json.dumps(v) for v in node["enum"])
        branches = node.get("anyOf") or node.get("oneOf") or node.get("allOf")
        if isinstance(node.get("type"), list):
            branches = [{**node, "type": t} for t in node["type"]]
        if branches:
            kinds = list(dict.fromkeys(self.type_of(b) for b in branches))
            if "None" in kinds:  # optional last: `str | None`
                kinds.remove("None")
                kinds.append("None")
            return " | ".join(kinds)
        kind = node.get("type")
        if kind == "array":
            if "prefixItems" in node:
                return f"tuple[{', '.join(self.type_of(i) for i in node['prefixItems'])}]"
            return f"list[{self.type_of(node['items'])}]" if node.get("items") else "list"
        if kind == "object":
            extra = node.get("additionalProperties")
            return f"dict[str, {self.type_of(extra)}]" if isinstance(extra, dict) and extra else "dict"
        if kind == "string":
            return _FORMATS.get(node.get("format", ""), "str")
        return _SCALARS.get(kind, "any") if isinstance(kind, str) else "any"

    def limits_of(self, node: dict[str, Any]) -> list[str]:
        if node.get("anyOf") == _DURATION_ANY_OF:
            return []
        if "$ref" in node:
            _, target = self._target(node["$ref"])
            return [] if "properties" in target else self.limits_of(target)
        found = _bounds("x", node.get("minimum"), node.get("exclusiveMinimum"),
                        node.get("maximum"), node.get("exclusiveMaximum"))
        found += _bounds("len", node.get("minLength"), None, node.get("maxLength"), None)
        found += _bounds("len", node.get("minItems"), None, node.get("maxItems"), None)
        found += _bounds("keys", node.get("minProperties"), None, node.get("maxProperties"), None)
        if "multipleOf" in node:
            found.append(f"multiple of {json.dumps(node['multipleOf'])}")
        if node.get("uniqueItems"):
            found.append("unique items")
        if "pattern" in node:
            found.append(f"pattern {node['pattern']}")
        for branch in node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", []):
            found += self.limits_of(branch)
        if isinstance(node.get("items"), dict):
            found += [f"each: {limit}" for limit in self.limits_of(node["items"])]
        if isinstance(node.get("additionalProperties"), dict):
            found += [f"each value: {limit}" for limit in self.limits_of(node["additionalProperties"])]
        return list(dict.fromkeys(found))

    def fields(self, node: dict[str, Any] | None = None) -> list[FieldDoc]:
        node = self.root if node is None else node
        required = set(node.get("required", []))
        docs = []
        for name, prop in node.get("properties", {}).items():
            description = prop.get("description", "")
            if not description and (key := self._model_ref(prop)):  # `consul: ConsulTarget` says what that is
                description = self.defs[key].get("description", "").strip().split("\n", 1)[0]
            kind, default = self.type_of(prop), prop.get("default")
            if kind == "duration" and default is not None:  # pydantic writes ISO 8601 (PT1M30S): say 1m30s
                default = format_duration(_TIMEDELTA.validate_python(default))
            docs.append(FieldDoc(name=name, type=kind, required=name in required, has_default="default" in prop,
                                 default=default, limits=self.limits_of(prop), description=_paragraphs(description)))
        return docs

    def models(self) -> list[ModelDoc]:
        """The models the fields name, nested ones too, in the order they are first met."""
        found: dict[str, None] = {}

        def visit(node: Any) -> None:
            if isinstance(node, dict):
                if isinstance(node.get("$ref"), str):
                    key, target = self._target(node["$ref"])
                    if key not in found:
                        if "properties" in target:
                            found[key] = None
                        visit(target)
                for keyword, value in node.items():
                    if keyword != "$defs":
                        visit(value)
            elif isinstance(node, list):
                for item in node:
                    visit(item)

        visit(self.root.get("properties", {}))
        return [ModelDoc(name=self.names[key], description=_paragraphs(self.defs[key].get("description", "")),
                         fields=self.fields(self.defs[key])) for key in found]


def _bounds(subject: str, low: Any, low_open: Any, high: Any, high_open: Any) -> list[str]:
    lower = f"{json.dumps(low)} ≤ " if low is not None else f"{json.dumps(low_open)} < " if low_open is not None else ""
    upper = f" ≤ {json.dumps(high)}" if high is not None else f" < {json.dumps(high_open)}" if high_open is not None else ""
    if lower and upper:
        return [f"{lower}{subject}{upper}"]
    if lower:  # `x ≥ 1` reads better than `1 ≤ x`
        return [f"{subject} {'≥' if low is not None else '>'} {json.dumps(low if low is not None else low_open)}"]
    return [f"{subject}{upper}"] if upper else []


def _paragraphs(text: str) -> str:
    """A docstring's or description's paragraphs, each on one line (and each item of a `- ` list)."""
    blocks = []
    for block in text.strip().split("\n\n"):
        lines: list[str] = []
        for line in (line.strip() for line in block.splitlines()):
            if lines and not line.startswith(("- ", "* ")):
                lines[-1] += " " + line
            else:
                lines.append(line)
        blocks.append("\n".join(line for line in lines if line))
    return "\n\n".join(block for block in blocks if block)


def suggest(name: str, names: list[str]) -> list[str]:
    """The actions (or namespaces) nearest a mistyped name, matched on the whole name, on its last part
    (`health`: consul.health, vault.health) and on the namespace (`consl`: consul); the best matches only."""
    pool: dict[str, list[str]] = {}
    for full in names:
        pool.setdefault(full, []).append(full)
        pool.setdefault(full.rsplit(".", 1)[-1], []).append(full)
        namespace = full.split(".", 1)[0]
        pool.setdefault(namespace, [namespace])
    scores = {candidate: difflib.SequenceMatcher(None, name, candidate).ratio() for candidate in pool}
    best = max(scores.values(), default=0.0)
    if best < 0.6:
        return []
    found: list[str] = []
    for candidate in sorted(pool, key=lambda c: -scores[c]):
        if scores[candidate] >= best - 0.05:
            found += [n for n in pool[candidate] if n not in found]
    return found[:4]


def lookup(docs: list[ActionDoc], name: str) -> list[ActionDoc]:
    """The action called `name`, or every action of the namespace `name` (consul, consul.kv); else UnknownAction."""
    exact = [doc for doc in docs if doc.name == name]
    if exact:
        return exact
    within = [doc for doc in docs if doc.name.startswith(name.rstrip(".") + ".")]
    if within:
        return within
    close = suggest(name, [doc.name for doc in docs])
    hint = f"; did you mean {', '.join(close[:-1]) + ' or ' if len(close) > 1 else ''}{close[-1]}?" if close else ""
    raise UnknownAction(f"unknown action {name!r}{hint} (`coldstart actions` lists them all)")


def undo_text(doc: ActionDoc) -> str:
    if doc.undo is None:
        return "none"
    given = f"the output's {doc.undo_from_output}" if doc.undo_from_output else "the step's own arguments"
    return f"{doc.undo}, given {given}"


def retry_text(retry: dict[str, Any]) -> str:
    """The policy as a step's `retry:` would write it."""
    return "{" + ", ".join(f"{key}: {value}" for key, value in retry.items()) + "}"


def default_text(field: FieldDoc) -> str:
    if field.required or not field.has_default:
        return ""
    return json.dumps(field.default, ensure_ascii=False)


def example_step(doc: ActionDoc) -> str:
    """A step calling the action with its required arguments, as YAML with placeholders."""
    lines = ["- id: <step id>", f"  action: {doc.name}"]
    required = [f for f in doc.inputs if f.required]
    if required:
        lines.append("  with:")
        lines += [f"    {f.name}: <{f.type}>" for f in required]
    return "\n".join(lines)


# ---- the terminal -------------------------------------------------------------------------------------------


def render_table(console: Console, docs: list[ActionDoc]) -> None:
    """One line an action where the terminal allows: the summary takes the width left; the undo, when there is
    one, follows it, so an 80-column terminal still reads every summary."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("action", no_wrap=True)
    table.add_column("mutates", no_wrap=True)
    table.add_column("timeout", no_wrap=True)
    table.add_column("summary (undo)", ratio=1, min_width=24)
    for doc in docs:
        summary = Text(doc.summary)
        if doc.undo:
            summary.append(f" (undo: {doc.undo})", style="dim")
        table.add_row(Text(doc.name), "yes" if doc.mutating else "no", doc.timeout, summary)
    console.print(table)


def _fields_table(fields: list[FieldDoc], *, inputs: bool) -> Table:
    if inputs:
        table = Table("name", "type", "required", "default", "limits", "description")
        for f in fields:
            table.add_row(Text(f.name, style="bold"), Text(f.type), "yes" if f.required else "",
                          Text(default_text(f)), Text("\n".join(f.limits)), Text(f.description))
    else:
        table = Table("name", "type", "description")
        for f in fields:
            table.add_row(Text(f.name, style="bold"), Text(f.type), Text(f.description))
    return table


def _types(console: Console, models: list[ModelDoc], *, inputs: bool) -> None:
    for model in models:
        console.print(Text.assemble((model.name, "bold"), (f": {model.description}" if model.description else "")))
        console.print(_fields_table(model.fields, inputs=inputs))


def render_one(console: Console, doc: ActionDoc) -> None:
    console.print(Text(doc.name, style="bold"))
    console.print(Text(doc.description))
    console.print()
    facts = Table.grid(padding=(0, 2))
    facts.add_row("mutates", "yes" if doc.mutating else "no")
    facts.add_row("undo", Text(undo_text(doc)))
    facts.add_row("timeout", doc.timeout + (f" (heartbeat every {doc.heartbeat})" if doc.heartbeat else ""))
    facts.add_row("retry", Text(retry_text(doc.retry)))
    console.print(facts)
    console.print()
    console.print(Text(f"inputs (with:), {doc.input_model}", style="bold"))
    if doc.inputs:
        console.print(_fields_table(doc.inputs, inputs=True))
    else:
        console.print("none")
    _types(console, doc.input_types, inputs=True)
    console.print()
    console.print(Text(f"output, {doc.output_model}" if doc.output_model else "output: none", style="bold"))
    if doc.outputs:
        console.print(_fields_table(doc.outputs, inputs=False))
    shown = [_shown(m) for m in doc.input_types]  # a model shown with the inputs is not shown again
    _types(console, [m for m in doc.output_types if _shown(m) not in shown], inputs=False)
    console.print()
    console.print(Text("example step", style="bold"))
    console.print(Text(example_step(doc)))


# ---- the page -----------------------------------------------------------------------------------------------


class _Anchors:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes, repeats numbered."""

    def __init__(self) -> None:
        self.used: Counter[str] = Counter()

    def __call__(self, heading: str) -> str:
        slug = "".join(c for c in heading.lower() if c.isalnum() or c in " -_").replace(" ", "-")
        n = self.used[slug]
        self.used[slug] += 1
        return slug if n == 0 else f"{slug}-{n}"


def _cell(text: str) -> str:
    return text.replace("\n\n", " ").replace("\n", " ").replace("|", "\\|")


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}" if text else ""


def _md_fields(fields: list[FieldDoc], *, inputs: bool) -> list[str]:
    if not fields:
        return ["None."]
    if not inputs:
        rows = ["| Name | Type | Description |", "| --- | --- | --- |"]
        rows += [f"| {_cell(_code(f.name))} | {_cell(_code(f.type))} | {_cell(f.description)} |" for f in fields]
        return rows
    rows = ["| Name | Type | Required | Default | Limits | Description |", "| --- | --- | --- | --- | --- | --- |"]
    for f in fields:
        limits = ", ".join(_code(limit) for limit in f.limits)
        rows.append(f"| {_cell(_code(f.name))} | {_cell(_code(f.type))} | {'yes' if f.required else ''} | "
                    f"{_cell(_code(default_text(f)))} | {_cell(limits)} | {_cell(f.description)} |")
    return rows


class _Variant:
    """One meaning of a model's name on the page, and the actions using it."""

    def __init__(self, model: ModelDoc, inputs: bool):
        self.model, self.inputs = model, inputs
        self.users: list[str] = []
        self.heading = self.anchor = ""

    def matches(self, model: ModelDoc, inputs: bool) -> bool:
        if inputs:
            return self.inputs and model == self.model
        return _shown(model) == _shown(self.model)  # an output's model: what the page shows of it


def _shown(model: ModelDoc) -> tuple[Any, ...]:
    """What the page shows of an output's model."""
    return model.name, model.description, [(f.name, f.type, f.description) for f in model.fields]


def to_markdown(docs: list[ActionDoc]) -> str:
    """The reference as one Markdown page: an index, each action, then the models their fields name."""
    anchors = _Anchors()
    anchors("Actions")  # the page's own headings come first in GitHub's numbering
    action_anchor = {doc.name: anchors(doc.name) for doc in docs}
    anchors("Types")
    # One section per model; a name that means different fields in different actions gets one per variant. An
    # output shows a model's names, types and descriptions only, so an input's variant with the same serves both.
    variants: dict[str, list[_Variant]] = {}
    for role in ("input_types", "output_types"):
        for doc in docs:
            for model in getattr(doc, role):
                known = variants.setdefault(model.name, [])
                variant = next((v for v in known if v.matches(model, role == "input_types")), None)
                if variant is None:
                    known.append(variant := _Variant(model, role == "input_types"))
                if doc.name not in variant.users:
                    variant.users.append(doc.name)
                    variant.users.sort()
    for name in sorted(variants):
        for variant in variants[name]:
            variant.heading = name if len(variants[name]) == 1 else f"{name} (in {', '.join(variant.users)})"
            variant.anchor = anchors(variant.heading)

    def link(model: ModelDoc, inputs: bool) -> str:
        variant = next(v for v in variants[model.name] if v.matches(model, inputs))
        return f"[`{model.name}`](#{variant.anchor})"

    retry_defaults = retry_text(_retry_fields(Retry.model_validate({})))
    lines = [
        "# Action reference",
        "",
        f"<!-- Generated by `{COMMAND}` from the action registry: edit the actions, not this page. -->",
        "",
        "Every action a runbook step may call: `action: NAME`, its arguments under `with:`, checked against the",
        "inputs below when the runbook is validated (`coldstart validate`). A field without a default is required.",
        "Limits use `x` for a number's value and `len` for a string's or list's length; `each:` is about every",
        "item of a list. A `duration` is a number of seconds or a string such as `250ms`, `30s`, `10m`, `1h30m`.",
        "",
        "Timeout and retry are the action's own; a step's `timeout:` replaces the timeout, and its `retry:` the",
        f"whole retry policy (what it leaves out takes the defaults, `{retry_defaults}`). A step's outputs",
        "(`${{ steps.ID.outputs.FIELD }}`) are the output's fields. An action that mutates changes the system it",
        "acts on. Its undo (or the step's own `undo:`) runs when the run rolls back: a failed step's",
        "`on_failure: rollback`, or `coldstart abort --undo`.",
        "",
        "The same, in the terminal: `coldstart actions [NAME]` (`--json` for scripts).",
        "",
        "## Actions",
        "",
        "| Action | Mutates | Undo | Timeout | Summary |",
        "| --- | --- | --- | --- | --- |",
    ]
    for doc in docs:
        lines.append(f"| [`{doc.name}`](#{action_anchor[doc.name]}) | {'yes' if doc.mutating else 'no'} | "
                     f"{_cell(_code(doc.undo or ''))} | {doc.timeout} | {_cell(doc.summary)} |")
    for doc in docs:
        undo = "none" if doc.undo is None else (
            f"[`{doc.undo}`](#{action_anchor[doc.undo]})" if doc.undo in action_anchor else _code(doc.undo))
        if doc.undo is not None:
            undo += f", given the output's `{doc.undo_from_output}`" if doc.undo_from_output else \
                ", given the step's own arguments"
        lines += [
            "",
            f"## `{doc.name}`",
            "",
            doc.description,
            "",
            f"- **Mutates:** {'yes' if doc.mutating else 'no'}",
            f"- **Undo:** {undo}",
            f"- **Timeout:** {doc.timeout}" + (f" (heartbeat every {doc.heartbeat})" if doc.heartbeat else ""),
            f"- **Retry:** `{retry_text(doc.retry)}`",
            "",
            f"**Inputs** (`with:`, `{doc.input_model}`)",
            "",
            *_md_fields(doc.inputs, inputs=True),
        ]
        if doc.input_types:
            lines += ["", "Input types: " + ", ".join(link(m, True) for m in doc.input_types)]
        lines += ["", f"**Output** (`{doc.output_model}`)" if doc.output_model else "**Output:** none"]
        if doc.output_model:
            lines += ["", *_md_fields(doc.outputs, inputs=False)]
        if doc.output_types:
            lines += ["", "Output types: " + ", ".join(link(m, False) for m in doc.output_types)]
        lines += ["", "```yaml", example_step(doc), "```"]
    lines += ["", "## Types", "", "The models that inputs and outputs name, with their own fields."]
    for name in sorted(variants):
        for variant in variants[name]:
            heading = f"`{name}`" + variant.heading[len(name):]
            lines += ["", f"### {heading}", ""]
            if variant.model.description:
                lines += [variant.model.description, ""]
            lines += [*_md_fields(variant.model.fields, inputs=variant.inputs), "",
                      "Used by: " + ", ".join(f"[`{u}`](#{action_anchor[u]})" for u in variant.users)]
    return "\n".join(lines) + "\n"
