"""Runbook validation: every error at once, each as file:line:col, exit 2, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import support
from workflows.loader import RunbookInvalid, plan_run

LOCATED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): \S")
REPO = Path(__file__).resolve().parents[1]


def errors_of(tmp_path: Path, body: str) -> list[str]:
    file = support.write_runbook(tmp_path, body)
    with pytest.raises(RunbookInvalid) as caught:
        plan_run(file, registry=support.registry(), inventory={"name": "t", "consul": {"servers": ["a"]}})
    for line in caught.value.errors:
        assert LOCATED.match(line), line
    return caught.value.errors


def test_bundled_runbooks_validate():
    for file in sorted((REPO / "runbooks").glob("*.yaml")):
        plan_run(file, registry=support.registry(), placeholders=True)


def test_reports_every_error_with_its_location(tmp_path):
    errors = errors_of(tmp_path, """\
        metadata: {name: ok}
        target: t
        steps:
          - id: one
            action: core.nope
          - id: two
            action: core.note
            with: {message: hi, colour: blue}
          - id: two
            action: core.note
            with: {message: "${{ steps.ghost.outputs.key }}"}
          - id: three
            action: core.wait
            with: {seconds: "${{ steps.four.outputs.waited_seconds }}"}
          - id: four
            action: core.wait
            with: {seconds: lots}
          - id: five
            action: core.note
            with: {message: "${{ steps.one.outputs.x }} ${{ target.consul.nope }} ${{ params.missing }}"}
    """)
    text = "\n".join(errors)
    expected = [
        ":5:13: unknown action 'core.nope'",
        ":8:25: unknown argument 'colour' for action core.note",
        ":9:9: duplicate step id 'two' (first defined at line 6)",
        ":11:21: reference 'steps.ghost.outputs.key': no step 'ghost'",
        ":14:21: reference cycle: 'steps.four.outputs.waited_seconds' refers to step 'four', which runs after this one",
        ":17:21: argument seconds of core.wait: Input should be a valid number",
        ":20:21: reference does not resolve",
    ]
    for fragment in expected:
        assert fragment in text, f"missing {fragment!r} in:\n{text}"


def test_self_reference_and_parallel_siblings(tmp_path):
    errors = errors_of(tmp_path, """\
        metadata: {name: ok}
        target: t
        steps:
          - id: self
            action: core.note
            with: {message: "${{ steps.self.outputs.key }}"}
          - id: group
            parallel:
              - id: left
                action: core.note
                with: {message: x}
              - id: right
                action: core.note
                with: {message: "${{ steps.left.outputs.key }}"}
    """)
    assert any("refers to the step it is used in" in e for e in errors)
    assert any(":14:" in e and "runs in parallel" in e for e in errors)


def test_kind_and_field_errors(tmp_path):
    errors = errors_of(tmp_path, """\
        metadata: {name: Bad Name}
        target: t
        steps:
          - id: nokind
          - id: both
            wait: 1s
            action: core.note
          - id: g
            gate: {endpoint: "http://p", query: up, comparator: "=~", threshold: 1}
          - id: r
            ramp: {action: core.note, with: {message: x}, percentages: [50, 20]}
          - id: f
            for_each: {items: [1], action: core.note, with: {message: x}, error_threshold: "lots"}
    """)
    text = "\n".join(errors)
    assert ":1:18: metadata.name" in text
    assert ":4:5:" in text and "exactly one of" in text
    assert ":5:5:" in text
    assert ":9:" in text and "comparator" in text
    assert ":11:" in text and "ramp percentages must increase" in text
    assert ":13:" in text and "error_threshold" in text


def test_yaml_syntax_error_and_duplicate_keys(tmp_path):
    errors = errors_of(tmp_path, "metadata: {name: a}\ntarget: t\nsteps:\n  - id: a\n    wait: 1s\n    wait: 2s\n")
    assert errors == [f"{tmp_path / 'test.yaml'}:6:5: duplicate key 'wait'"]
    errors = errors_of(tmp_path, "metadata: {name: a\ntarget: t\n")
    assert len(errors) == 1 and "invalid YAML" in errors[0]


def test_parameters_are_typed(tmp_path):
    file = support.write_runbook(tmp_path, """\
        metadata: {name: p}
        target: t
        params:
          n: {type: integer, default: 3}
          need: {type: string}
        steps:
          - id: w
            action: core.wait
            with: {seconds: "${{ params.n }}"}
    """)
    with pytest.raises(RunbookInvalid) as caught:
        plan_run(file, registry=support.registry(), params={"n": "three", "extra": 1})
    text = "\n".join(caught.value.errors)
    assert "expected integer" in text and "'need' is required" in text and "unknown parameter 'extra'" in text
    run = plan_run(file, registry=support.registry(), params={"n": "7", "need": "x"})
    assert run.params == {"n": 7, "need": "x"}
    assert run.runbook.steps[0].with_["seconds"] == 7


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_cli_validate_exit_codes(tmp_path):
    good = _cli("validate", "runbooks/demo.yaml")
    assert good.returncode == 0, good.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("metadata: {name: x}\ntarget: t\nsteps:\n  - id: a\n    action: core.nope\n")
    result = _cli("validate", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == f"{bad}:5:13: unknown action 'core.nope' (known: core.http_check, core.note, core.prometheus_query, core.wait)"
    missing = _cli("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, width=16) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(
        ["id", "action", "with", "gate", "wait", "ramp", "steps", "metadata", "name", "target", "for_each", "parallel",
         "approval", "items", "on_failure", "comparator", "threshold", "query", "endpoint", "${{ x }}"]), children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=yaml_values, mangle=st.sampled_from(["none", "truncate", "tabs", "garbage"]))
def test_fuzz_malformed_runbooks_always_give_a_located_error(tmp_path, doc, mangle):
    base = {"metadata": {"name": "fuzz"}, "target": "t", "steps": [{"id": "a", "wait": "1s"}]}
    text = yaml.safe_dump(doc if isinstance(doc, dict) else {"steps": doc}) if doc is not None else ""
    if mangle == "truncate":
        text = yaml.safe_dump(base)[: len(text) % 40]
    elif mangle == "tabs":
        text = "\t" + text.replace(" ", "\t")
    elif mangle == "garbage":
        text = text + "\n: : [ {\n"
    file = tmp_path / "fuzz.yaml"
    file.write_text(text)
    try:
        plan_run(file, registry=support.registry())
    except RunbookInvalid as exc:
        assert exc.errors
        for line in exc.errors:
            assert LOCATED.match(line), line
    # A document that happens to be valid is fine too; any other exception fails the test.


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_fuzz_cli_exit_2_without_traceback(tmp_path, text):
    file = tmp_path / "cli-fuzz.yaml"
    file.write_text(text)
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["validate", str(file)])
    assert result.exit_code in (0, 2)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code == 2:
        assert all(LOCATED.match(line) for line in result.stderr.strip().splitlines()), result.stderr
