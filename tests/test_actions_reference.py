"""`coldstart actions`: the action reference has every action and every input, docs/actions.md is what the
generator writes now, and the command lists, shows, prints JSON and refuses an unknown name."""

import difflib
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from activities._fields import AbsoluteName, BaseUrl, IPv4
from activities.binding import action
from activities.catalog import load_registry
from activities.registry import Registry
from activities.retry import Duration, Retry, format_duration, parse_duration
from cli.actions import ActionDoc, FieldDoc, ModelDoc, UnknownAction, describe, lookup, to_markdown

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "actions.md"
REGENERATE = "coldstart actions --markdown > docs/actions.md"


@pytest.fixture(scope="module")
def docs() -> list[ActionDoc]:
    return describe(load_registry())


def _section(page: str, name: str) -> str:
    return page.split(f"\n## `{name}`\n", 1)[1].split("\n## ", 1)[0]


def test_every_action_is_described_with_every_input_field(docs):
    registry = load_registry()
    assert [doc.name for doc in docs] == registry.names() and len(docs) >= 30
    page = to_markdown(docs)
    for doc in docs:
        spec = registry.specs[doc.name]
        # What a step's `with:` may name (workflows/loader._check_args): a field's alias, else its name.
        fields = {(info.alias or name): info for name, info in spec.input_model.model_fields.items()}
        assert [f.name for f in doc.inputs] == list(fields), doc.name
        assert {f.name for f in doc.inputs if f.required} == {k for k, info in fields.items() if info.is_required()}
        assert all(f.type and f.type != "any" for f in doc.inputs), doc.name
        if spec.output_model is not None:
            assert [f.name for f in doc.outputs] == [info.alias or name for name, info in
                                                     spec.output_model.model_fields.items()], doc.name
        assert (doc.mutating, doc.undo, doc.undo_from_output) == (spec.mutating, spec.undo, spec.undo_from_output)
        assert parse_duration(doc.timeout) == spec.timeout
        section = _section(page, doc.name)
        for name in fields:
            assert f"| `{name}` |" in section, f"{doc.name}: input {name} is not on the page"
        if spec.undo:
            assert spec.undo in section


def test_docs_actions_md_is_what_the_generator_writes(docs):
    expected = to_markdown(docs)
    shipped = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if shipped != expected:
        diff = list(difflib.unified_diff(shipped.splitlines(), expected.splitlines(), "docs/actions.md",
                                         "generated", lineterm="", n=1))
        pytest.fail(f"docs/actions.md is stale: regenerate it with `{REGENERATE}`\n" + "\n".join(diff[:40]))


# ---- the schema reading, on a model of our own --------------------------------------------------------------


class _Inner(BaseModel):
    """A nested model.

    Its second paragraph."""

    port: Annotated[int, Field(ge=1, le=65535)] = 22


class _In(BaseModel):
    url: BaseUrl
    zone: AbsoluteName
    ip: IPv4 | None = None
    count: Annotated[int, Field(ge=1, le=100)] = 5
    ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z]+$", description="a name")]
    tags: Annotated[list[Annotated[str, Field(max_length=8)]], Field(min_length=1)]
    mode: Literal["a", "b"] = "a"
    wait: Duration = timedelta(seconds=90)
    inner: _Inner
    counts: dict[str, int] = Field(default_factory=dict)
    hosts: list[str] = Field(default_factory=list)


class _Out(BaseModel):
    key: str = Field(description="the key")
    again: _In


def _thing_registry() -> Registry:
    registry = Registry()

    @action("t.thing", registry=registry, timeout=90, heartbeat=timedelta(hours=1, minutes=30),
            retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=200)), mutating=True, undo="t.thing", undo_from_output="again")
    def thing(inp: _In) -> _Out:
        """Do the thing.

        At length,
        over two lines."""
        raise NotImplementedError

    return registry


def test_types_limits_and_defaults_are_read_from_the_models_schema():
    [doc] = describe(_thing_registry())
    assert (doc.summary, doc.description) == ("Do the thing.", "Do the thing.\n\nAt length, over two lines.")
    assert (doc.timeout, doc.heartbeat) == ("90s", "1h30m")
    assert doc.retry == {"max_attempts": 2, "initial_interval": "0.2s", "backoff": 2.0, "max_interval": "30s"}
    assert (doc.mutating, doc.undo, doc.undo_from_output, doc.input_model, doc.output_model) == (
        True, "t.thing", "again", "_In", "_Out")
    got = {f.name: (f.type, f.required, f.default if f.has_default else "-", f.limits) for f in doc.inputs}
    assert got == {
        "url": ("url", True, "-", []),
        "zone": ("dns name", True, "-", []),
        "ip": ("ipv4 | None", False, None, []),
        "count": ("int", False, 5, ["1 ≤ x ≤ 100"]),
        "ratio": ("float", False, 0.5, ["0 < x < 1"]),
        "name": ("str", True, "-", ["1 ≤ len ≤ 64", "pattern ^[a-z]+$"]),
        "tags": ("list[str]", True, "-", ["len ≥ 1", "each: len ≤ 8"]),
        "mode": ('"a" | "b"', False, "a", []),
        "wait": ("duration", False, "90s", []),
        "inner": ("_Inner", True, "-", []),
        "counts": ("dict[str, int]", False, {}, []),
        "hosts": ("list[str]", False, [], []),
    }
    described = {f.name: f.description for f in doc.inputs}
    assert described["name"] == "a name"
    assert described["inner"] == "A nested model."  # a model-typed field without its own: the model's first line
    assert doc.input_types == [ModelDoc(name="_Inner", description="A nested model.\n\nIts second paragraph.",
                                        fields=[FieldDoc(name="port", type="int", required=False, has_default=True,
                                                         default=22, limits=["1 ≤ x ≤ 65535"])])]
    assert [(f.name, f.type, f.description) for f in doc.outputs] == [("key", "str", "the key"), ("again", "_In", "")]
    assert [m.name for m in doc.output_types] == ["_In", "_Inner"]
    page = to_markdown([doc])
    assert "| `count` | `int` |  | `5` | `1 ≤ x ≤ 100` |  |" in page
    assert "| `mode` | `\"a\" \\| \"b\"` |" in page  # a | in a table cell is escaped
    assert "Input types: [`_Inner`](#_inner)" in page and "\n### `_Inner`\n" in page
    assert "- **Undo:** [`t.thing`](#tthing), given the output's `again`" in page
    assert "- **Timeout:** 90s (heartbeat every 1h30m)" in page


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (0.25, "0.25s"), (30, "30s"), (90, "90s"), (600, "10m"),
                                           (5400, "1h30m"), (7 * 86400, "168h"), (3661, "1h1m1s")])
def test_durations_read_as_a_runbook_writes_them(seconds, text):
    assert format_duration(timedelta(seconds=seconds)) == text
    assert parse_duration(text) == timedelta(seconds=seconds)


def test_an_unknown_name_suggests_the_nearest(docs):
    with pytest.raises(UnknownAction, match=r"unknown action 'firewall\.blok'; did you mean firewall\.block\?"):
        lookup(docs, "firewall.blok")
    with pytest.raises(UnknownAction, match=r"did you mean consul\.health or vault\.health\?"):
        lookup(docs, "health")
    assert [d.name for d in lookup(docs, "consul.kv")] == ["consul.kv.delete_prefix", "consul.kv.restore",
                                                            "consul.kv.set"]


# ---- the command --------------------------------------------------------------------------------------------


def _invoke(*args: str):
    import cli.main

    # Rich fixes a console's width when the console is made (cli.main's, at import, from whatever COLUMNS was
    # then in this process), so widen it here: rows unwrapped whichever test imported cli.main first.
    width = cli.main.out.width
    cli.main.out.width = 250
    try:
        return CliRunner().invoke(cli.main.app, ["actions", *args], env={"COLUMNS": "250"})
    finally:
        cli.main.out.width = width


def test_the_command_lists_shows_and_prints_json_and_markdown(docs):
    import cli.main

    listed = _invoke()
    assert listed.exit_code == 0, listed.output
    assert all(doc.name in listed.output for doc in docs)

    doc = next(d for d in docs if d.undo and any(f.limits for f in d.inputs))
    shown = _invoke(doc.name)
    assert shown.exit_code == 0, shown.output
    for text in [doc.undo, doc.timeout, *(f.name for f in doc.inputs), *(lim for f in doc.inputs for lim in f.limits)]:
        assert text in shown.output, text

    every = _invoke("--json")
    assert every.exit_code == 0 and json.loads(every.output) == [d.model_dump(mode="json") for d in docs]
    one = _invoke(doc.name, "--json")
    assert one.exit_code == 0 and json.loads(one.output) == doc.model_dump(mode="json")

    page = _invoke("--markdown")
    assert page.exit_code == 0 and page.output == to_markdown(docs)

    both = _invoke("--json", "--markdown")
    assert isinstance(both.exception, cli.main.CliError) and both.exception.code == 2


def test_an_unknown_action_is_one_line_and_exit_2():
    result = subprocess.run([sys.executable, "-m", "cli.main", "actions", "firewall.blok"], cwd=REPO, check=False,
                            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: unknown action 'firewall.blok'; did you mean firewall.block? (`coldstart actions` lists them all)"]
