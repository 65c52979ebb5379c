"""Runbook validation: every error at once, each as file:line:col, exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError as PydanticValidationError

from tests import support
from workflows.loader import InventoryInvalid, RunbookInvalid, load_inventory, plan_run, read_inventory
from workflows.yaml_safety import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    MAX_NODES,
    PythonGuardedLoader,
    YamlRefused,
    load_file,
    load_text,
    read_text,
)

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


def test_non_finite_gate_numbers_are_refused_where_written(tmp_path):
    # NaN compares false with everything and an infinity bounds nothing: a gate or ramp with one never means it.
    errors = errors_of(tmp_path, """\
        metadata: {name: nan}
        target: t
        steps:
          - id: g
            gate: {endpoint: "http://p", query: up, comparator: ">=", threshold: .nan}
          - id: h
            gate:
              endpoint: "http://p"
              query: up
              comparator: "<"
              threshold: -.inf
          - id: r
            ramp:
              action: core.note
              with: {message: x}
              gates:
                - {name: a, endpoint: "http://x", query: up, comparator: "!=", threshold: .Inf}
              adaptive: {max_rate: .inf, headroom: .NaN}
          - id: w
            wait: .inf
    """)
    file = tmp_path / "test.yaml"
    assert errors == [
        f"{file}:5:74: steps[0].gate.threshold: Input should be a finite number",
        f"{file}:11:18: steps[1].gate.threshold: Input should be a finite number",
        f"{file}:17:83: steps[2].ramp.gates[0].threshold: Input should be a finite number",
        f"{file}:18:28: steps[2].ramp.adaptive.max_rate: Input should be a finite number",
        f"{file}:18:44: steps[2].ramp.adaptive.headroom: Input should be a finite number",
        f"{file}:20:11: steps[3].wait: a duration is a finite number of seconds",
    ]


def test_a_non_finite_number_parameter_is_refused(tmp_path):
    file = support.write_runbook(tmp_path, """\
        metadata: {name: p}
        target: t
        params:
          floor: {type: number, default: 0.8}
          wait: {type: duration, default: 1s}
        steps:
          - id: g
            gate: {endpoint: "http://p", query: up, comparator: ">=", threshold: "${{ params.floor }}"}
          - id: w
            wait: "${{ params.wait }}"
    """)
    assert plan_run(file, registry=support.registry()).runbook.steps[0].gate.threshold == 0.8  # pyright: ignore[reportAttributeAccessIssue]
    for name, value, said in [("floor", float("nan"), "number: Input should be a finite number"),
                              ("floor", "-Infinity", "number: Input should be a finite number"),
                              ("wait", float("inf"), "duration: a duration is a finite number of seconds"),
                              ("wait", 1e20, "duration: a duration is too long (at most 999999999 days)")]:
        with pytest.raises(RunbookInvalid) as caught:
            plan_run(file, registry=support.registry(), params={name: value})
        where = {"floor": "4:10", "wait": "5:9"}[name]
        assert caught.value.errors[0] == f"{file}:{where}: parameter {name!r} (given): expected {said}", caught.value


def test_a_removed_action_is_an_unknown_action(tmp_path):
    # consul.streaming.set set a KV flag nothing read; consul.agents.streaming changes the agents themselves.
    errors = errors_of(tmp_path, """\
        metadata: {name: gone}
        target: t
        steps:
          - id: flag
            action: consul.streaming.set
            with: {enabled: false}
    """)
    assert len(errors) == 1 and errors[0].startswith(f"{tmp_path / 'test.yaml'}:5:13: unknown action "
                                                     "'consul.streaming.set' (known: "), errors
    assert "consul.agents.streaming," in errors[0]


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
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)


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


def test_a_gate_interval_under_a_second_is_noted_where_written_and_still_valid(tmp_path):
    book = tmp_path / "fast.yaml"
    book.write_text("""metadata: {name: fast}
target: t
steps:
  - id: quick
    gate: {endpoint: "http://x", query: up, comparator: ">=", threshold: 1, interval: 0.25s}
  - id: both
    parallel:
      - id: steady
        gate: {endpoint: "http://x", query: up, comparator: ">=", threshold: 1, interval: 1s}
      - id: ramp
        ramp:
          action: core.note
          with: {message: ramping}
          start: 50
          stop: 100
          step: 50
          gates:
            - {name: a, endpoint: "http://x", query: up, comparator: ">=", threshold: 1, interval: 2s}
            - {name: b, endpoint: "http://x", query: up, comparator: ">=", threshold: 1,
               interval: 500ms}
""")
    notes: list[str] = []
    plan_run(book, registry=support.registry(), notes=notes)
    assert [n.split(": note: ")[0] for n in notes] == [f"{book}:5:87", f"{book}:20:26"], notes
    assert "step quick: gate interval 0.25s is under a second" in notes[0] and "step ramp: gate interval 0.5s" in notes[1]
    result = _cli("validate", str(book))
    assert result.returncode == 0 and result.stderr.strip().splitlines() == notes, result.stderr
    assert _cli("validate", "runbooks/demo.yaml").stderr == ""  # 1 s gates: nothing to say


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


# Hostile files: refused with exit 2 and one located line, fast and small, never a traceback or a hang.

BOUND_SECONDS = 2.0  # CPU seconds: what a refusal costs, whatever else the machine is running
BOUND_BYTES = 200 << 20


def _bomb(levels: int = 9, width: int = 9) -> bytes:
    lines = ['l0: &l0 "lol"']
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * width)}]")
    return ("\n".join(lines) + "\n").encode()


def _deep_block_mapping(levels: int) -> bytes:
    return "".join(" " * i + f"k{i}:\n" for i in range(levels)).encode() + b" " * levels + b"x\n"


# name -> (file content, or None for a 10 GiB sparse file; expected line:col; a fragment of the message)
HOSTILE: dict[str, tuple[bytes | None, str, str]] = {
    "alias-bomb": (_bomb(), "6:", "(MAX_NODES)"),
    "recursive-alias": (b"metadata: {name: x}\nsteps: &s [*s]\n", "2:12", "recursive alias"),
    "recursive-merge": (b"metadata: &m {<<: *m}\n", "1:19", "recursive alias"),
    "many-aliases": (b"x: &x 1\nl: [" + b"*x, " * 1001 + b"]\n", "2:", "(MAX_ALIASES)"),
    "deep-flow-sequence": (b"steps: " + b"[" * 50_000 + b"\n", "1:71", "(MAX_DEPTH)"),
    "deep-flow-mapping": (b"steps: " + b"{a: " * 15_000 + b"\n", "1:", "(MAX_DEPTH)"),
    "deep-block-mapping": (_deep_block_mapping(1000), "64:64", "(MAX_DEPTH)"),
    "deep-block-sequence": (b"steps:\n  " + b"- " * 30_000 + b"x\n", "2:", "(MAX_DEPTH)"),
    "big-file": (b"# a comment line\n" * 400_000, "1:1", "file is 6.5 MiB, over the 1 MiB limit (MAX_FILE_BYTES)"),
    "huge-sparse-file": (None, "1:1", "file is 10240 MiB, over the 1 MiB limit (MAX_FILE_BYTES)"),
    "megabyte-line": (b"metadata: {name: '" + b"x" * (3 << 20) + b"'}\n", "1:1", "(MAX_FILE_BYTES)"),
    "long-line": (b"metadata: {name: x}\nsteps: '" + b"x" * (200 << 10) + b"'\n", "2:1",
                  "over the 64 KiB limit (MAX_LINE_BYTES)"),
    "nul-bytes": (b"metadata:\n  name: \x00\x01\x02\xff\xfe", "2:9", "binary content"),
    "random-binary": (bytes(range(256)) * 4, "1:1", "binary content"),
    "invalid-utf8": (b"metadata:\n  name: caf\xe9\n", "2:12", "not UTF-8 text"),
    "utf16-bom": ("metadata: {name: x}\n".encode("utf-16"), "1:1", "UTF-16 byte-order mark"),
    "utf32-bom": ("metadata: {name: x}\n".encode("utf-32"), "1:1", "UTF-32 byte-order mark"),
    "control-character": (b"metadata: {name: a\x07b}\n", "1:19", "control character"),
    "tag-python-object": (b"metadata: !!python/object/apply:os.system ['echo owned']\n", "1:11",
                          "tag !!python/object/apply:os.system is not allowed"),
    "tag-custom": (b"metadata:\n  name: !custom x\n", "2:9", "tag !custom is not allowed"),
    "tag-binary": (b"metadata: {name: !!binary aGk=}\n", "1:18", "tag !!binary is not allowed"),
    "tag-str": (b"metadata:\n  name: !!str x\n", "2:9", "tag !!str is not allowed"),
    "tag-on-mapping": (b"metadata: !!map {name: x}\n", "1:11", "tag !!map is not allowed"),
    "tag-verbatim": (b"target: !<tag:yaml.org,2002:str> t\n", "1:9", "tag !!str is not allowed"),
    "tag-non-specific": (b"target: ! t\n", "1:9", "tag ! is not allowed"),
    "duplicate-top-level": (b"metadata: {name: x}\ntarget: t\ntarget: u\n", "3:1", "duplicate key 'target'"),
    "duplicate-nested": (b"metadata:\n  name: x\n  owner: a\n  owner: b\n", "4:3", "duplicate key 'owner'"),
    "duplicate-in-sequence": (b"steps:\n  - id: a\n    wait: 1s\n  - id: b\n    id: c\n", "5:5", "duplicate key 'id'"),
    "duplicate-deep-flow": (b"steps: [{id: a, with: {x: {y: {z: 1, z: 2}}}}]\n", "1:38", "duplicate key 'z'"),
    "duplicate-after-merge": (b"base: &b {x: 1}\nmetadata: {<<: *b, x: 2, x: 3}\n", "2:26", "duplicate key 'x'"),
}
BIG = {"alias-bomb", "recursive-alias", "recursive-merge", "many-aliases", "deep-flow-sequence",
       "deep-flow-mapping", "deep-block-mapping", "deep-block-sequence"}


def _write_hostile(directory: Path, name: str) -> Path:
    content = HOSTILE[name][0]
    path = directory / f"{name}.yaml"
    if content is None:
        with open(path, "wb") as fh:
            fh.truncate(10 << 30)  # sparse: only a reader that does not stat first would read it all
    else:
        path.write_bytes(content)
    return path


def _timed(call) -> tuple[Exception | None, float, int]:
    """Run call(); return what it raised, its CPU seconds and its peak of Python allocations."""
    tracemalloc.start()
    started = time.thread_time()
    try:
        call()
        raised = None
    except Exception as exc:  # noqa: BLE001 - returned for the test to judge
        raised = exc
    seconds = time.thread_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return raised, seconds, peak


def _assert_refused(line: str, file: Path, name: str) -> None:
    _, where, fragment = HOSTILE[name]
    assert LOCATED.match(line), line
    assert line.startswith(f"{file}:{where}"), (line, where)
    assert fragment in line, (line, fragment)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_runbook_is_refused_by_the_loader(tmp_path, name):
    file, registry = _write_hostile(tmp_path, name), support.registry()
    raised, seconds, peak = _timed(lambda: plan_run(file, registry=registry, placeholders=True))
    assert isinstance(raised, RunbookInvalid), repr(raised)
    assert len(raised.errors) == 1, raised.errors
    _assert_refused(raised.errors[0], file, name)
    assert seconds < BOUND_SECONDS, seconds
    assert peak < BOUND_BYTES, peak


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_inventory_is_refused(tmp_path, name):
    file = _write_hostile(tmp_path, name)
    for read in (lambda: load_inventory(name, tmp_path), lambda: read_inventory(file)):
        raised, seconds, peak = _timed(read)
        assert isinstance(raised, YamlRefused), repr(raised)
        _assert_refused(str(raised), file, name)
        assert seconds < BOUND_SECONDS and peak < BOUND_BYTES, (seconds, peak)


@pytest.mark.parametrize("name", sorted(BIG))
def test_pure_python_parser_is_guarded_the_same_way(name):
    """Where PyYAML has no libyaml the pure-Python parser is used: it must stop as early."""
    started = time.thread_time()
    with pytest.raises(YamlRefused) as caught:
        PythonGuardedLoader(HOSTILE[name][0].decode()).get_single_data()
    assert HOSTILE[name][2] in caught.value.message
    assert time.thread_time() - started < BOUND_SECONDS


# Runs the CLI's own entry (cli.main._run, what `coldstart` calls) once per argv, in one process,
# timing each command's CPU and reporting the process's peak resident memory.
_CLI_DRIVER = """
import json, sys, time
import cli.main
from activities.catalog import load_registry
load_registry()
report = []
for argv in json.loads(sys.argv[1]):
    print("@@@", file=sys.stderr, flush=True)
    sys.argv = ["coldstart", *argv]
    started = time.process_time()
    code = cli.main._run()
    sys.stderr.flush()
    report.append({"code": code, "seconds": time.process_time() - started})
# VmHWM is this process's own peak: ru_maxrss would carry over the forking parent's (pytest's) peak
# across exec on Linux.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"runs": report, "maxrss_kib": hwm}))
"""


def test_hostile_files_through_the_cli(tmp_path):
    files = {name: _write_hostile(tmp_path, name) for name in sorted(HOSTILE)}
    argvs = [["validate", str(file)] for file in files.values()]
    argvs += [["validate", "--target", name, "runbooks/demo.yaml"] for name in files]
    result = subprocess.run([sys.executable, "-c", _CLI_DRIVER, json.dumps(argvs)], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "COLDSTART_TARGETS": str(tmp_path)}, check=False)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    outputs = result.stderr.split("@@@\n")[1:]
    assert len(outputs) == len(argvs) == len(report["runs"])
    for (name, file), run, output in zip([*files.items(), *files.items()], report["runs"], outputs, strict=True):
        lines = output.strip().splitlines()
        assert run["code"] == 2 and len(lines) == 1, (name, run, output)
        _assert_refused(lines[0], file, name)
        assert run["seconds"] < BOUND_SECONDS, (name, run)
    assert report["maxrss_kib"] * 1024 < BOUND_BYTES, report["maxrss_kib"]


def test_hostile_files_through_the_installed_command(tmp_path):
    files = [_write_hostile(tmp_path, name) for name in ("alias-bomb", "deep-flow-sequence", "tag-python-object")]
    result = _cli("validate", *map(str, files))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3 and all(LOCATED.match(line) for line in lines), lines


def test_real_runbooks_and_inventories_are_within_the_limits():
    files = [*(REPO / "runbooks").glob("*.yaml"), *(REPO / "runbooks" / "drills").glob("*.yaml"),
             *(REPO / "targets").glob("*.yaml")]
    assert len(files) >= 4
    for file in files:
        assert isinstance(load_file(file), dict), file
    for target in (REPO / "targets").glob("*.yaml"):
        assert read_inventory(target, default_name=target.stem).name == target.stem


def test_merge_keys_may_be_overridden_but_not_repeated(tmp_path):
    text = "base: &b {x: 1, y: 2}\nother: &o {y: 3}\nmerged: {<<: [*b, *o], x: 9}\nagain: *o\n"
    assert load_text(text)["merged"] == {"x": 9, "y": 2}
    with pytest.raises(YamlRefused, match="duplicate key 'x'"):
        load_text(text.replace("x: 9}", "x: 9, x: 8}"))
    with pytest.raises(YamlRefused, match="takes a mapping"):
        load_text("a: {<<: [1]}\n")


def test_limits_admit_what_they_name(tmp_path):
    # Just inside every limit reads; one more is refused (no limit is off by one or unreachable).
    at_depth = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    load_text(at_depth)
    with pytest.raises(YamlRefused, match="MAX_DEPTH"):
        load_text("[" + at_depth + "]")
    nodes = "[" + ", ".join(["1"] * (MAX_NODES - 1)) + "]"
    load_text(nodes.replace(", ", ",\n"))
    with pytest.raises(YamlRefused, match="MAX_NODES"):
        load_text(nodes.replace(", ", ",\n").replace("[", "[1,\n", 1))
    aliases = "- &a 1\n" + "- *a\n" * MAX_ALIASES
    load_text(aliases)
    with pytest.raises(YamlRefused, match="MAX_ALIASES"):
        load_text(aliases + "- *a\n")
    line = "a: " + "x" * (MAX_LINE_BYTES - 3)
    load_text(line)
    with pytest.raises(YamlRefused, match="MAX_LINE_BYTES"):
        load_text(line + "x")
    file = tmp_path / "full.yaml"
    file.write_bytes(b"# x\n" * (MAX_FILE_BYTES // 4))
    assert read_text(file)
    file.write_bytes(b"# x\n" * (MAX_FILE_BYTES // 4) + b"\n")
    with pytest.raises(YamlRefused, match="MAX_FILE_BYTES"):
        read_text(file)


_TAGS = ["!!python/object:os.system", "!!python/name:os.system", "!custom", "!!binary", "!!str", "!!int",
         "!!map", "!!seq", "!!set", "!", "!<tag:example.com,2000:x>", "!e!x"]


def _alias_chain(levels: int, width: int, recursive: bool) -> str:
    lines = ["a0: &a0 x"]
    for n in range(1, levels + 1):
        lines.append(f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * width)}]")
    if recursive:
        lines.append(f"r: &r [*a{levels}, *r]")
    return "\n".join(lines) + "\n"


def _duplicate_at(depth: int, flow: bool) -> str:
    if flow:
        return "steps: " + "{a: " * depth + "{k: 1, k: 2}" + "}" * depth + "\n"
    return "".join("  " * i + f"a{i}:\n" for i in range(depth)) + "  " * depth + "k: 1\n" + "  " * depth + "k: 2\n"


hostile_documents = st.one_of(
    st.builds(lambda opens, depth: ("steps: " + "".join(opens) * depth).encode(),
              st.lists(st.sampled_from(["[", "{k: ", "[a, ", "{? ", "[{x: "]), min_size=1, max_size=3),
              st.integers(1, 4000)),
    st.builds(lambda depth, seq: (("- " * depth + "x") if seq else _deep_block_mapping(depth).decode()).encode(),
              st.integers(1, 600), st.booleans()),
    st.builds(lambda levels, width, recursive: _alias_chain(levels, width, recursive).encode(),
              st.integers(1, 10), st.integers(1, 12), st.booleans()),
    st.builds(lambda tag, value, where: f"metadata:\n  name: {tag} {value}\n".encode() if where
              else f"steps: {tag} {value}\n".encode(),
              st.sampled_from(_TAGS), st.sampled_from(["x", "[1, 2]", "{a: b}", "aGk=", "''"]), st.booleans()),
    st.builds(lambda prefix, body: prefix + body,
              st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\xff\xfe\x00\x00", b"metadata: "]),
              st.binary(max_size=300)),
    st.builds(lambda depth, flow: _duplicate_at(depth, flow).encode(), st.integers(0, 70), st.booleans()),
    st.builds(lambda size: b"a: '" + b"x" * size + b"'\n", st.sampled_from([(64 << 10) - 6, 64 << 10, 2 << 20])),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(content=hostile_documents)
def test_fuzz_hostile_documents_are_refused_fast_with_a_location(tmp_path, content):
    file, registry = tmp_path / "hostile.yaml", support.registry()
    file.write_bytes(content)
    raised, seconds, _ = _timed(lambda: plan_run(file, registry=registry, placeholders=True))
    assert raised is None or isinstance(raised, RunbookInvalid), repr(raised)
    for line in raised.errors if raised else []:
        assert LOCATED.match(line) and line.startswith(f"{file}:"), line
    assert seconds < BOUND_SECONDS, seconds
    # The same file as an inventory: guarded the same way, or located contract errors for one that reads.
    for read in (lambda: load_inventory("hostile", tmp_path), lambda: read_inventory(file)):
        raised, seconds, _ = _timed(read)
        assert raised is None or isinstance(raised, (YamlRefused, InventoryInvalid)), repr(raised)
        for line in raised.errors if isinstance(raised, InventoryInvalid) else [str(raised)] if raised else []:
            assert LOCATED.match(line) and line.startswith(f"{file}:"), line
        assert seconds < BOUND_SECONDS, seconds


def test_the_shipped_json_schema_is_the_models_schema() -> None:
    """Editors validate against runbooks/runbook.schema.json: it must be what `make schema` writes today."""
    from workflows.schema import runbook_json_schema

    shipped = json.loads((Path(__file__).parent.parent / "runbooks" / "runbook.schema.json").read_text())
    assert shipped == runbook_json_schema(), "runbooks/runbook.schema.json is stale: run `make schema`"


def test_one_retry_shape_from_runbook_to_temporal() -> None:
    """A step's retry: block, an action's defaults and the run input all carry the same Retry model."""
    from datetime import timedelta

    from activities.retry import Retry
    from workflows.spec import ActionDefaults, ActionStep

    step = ActionStep.model_validate({"id": "s", "action": "x", "retry": {"max_attempts": 2, "initial_interval": "3s"}})
    assert step.retry == Retry(max_attempts=2, initial_interval=timedelta(seconds=3))
    # Runbooks written with the old key still load, as the same shape.
    assert ActionStep.model_validate({"id": "s", "action": "x", "retry": {"interval": "3s", "max_attempts": 2}}).retry == step.retry
    from workflows.calls import retry_policy

    policy = retry_policy(step.retry)
    assert (policy.maximum_attempts, policy.initial_interval, policy.backoff_coefficient, policy.maximum_interval) == (
        2, timedelta(seconds=3), 2.0, timedelta(seconds=30))
    assert [Retry(initial_interval=timedelta(seconds=1), max_interval=timedelta(seconds=5)).delay(n).seconds
            for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    # One shape at the baseline: flat retry fields beside `retry` are refused, not merged.
    flat = {"name": "a", "timeout": "PT60S", "max_attempts": 3, "initial_interval": "PT1S", "backoff": 2.0,
            "max_interval": "PT30S"}
    with pytest.raises(PydanticValidationError):
        ActionDefaults.model_validate(flat)


def test_gate_reads_are_pinned_like_any_action(tmp_path: Path) -> None:
    """A gate's sample goes through telemetry.read with what its @action declares, pinned into the run."""
    from activities.registry import Registry

    body = """
metadata: {name: gated}
target: t
steps:
  - id: ready
    gate: {source: http, endpoint: "http://127.0.0.1:1/health", comparator: "==", threshold: 200}
"""
    file = support.write_runbook(tmp_path, body)
    run = plan_run(file, registry=support.registry())
    declared = support.registry().get("telemetry.read")
    pinned = run.actions["telemetry.read"]
    assert (pinned.timeout, pinned.retry) == (declared.timeout, declared.retry)
    assert pinned.retry.max_attempts == 1  # a failed read is a failed reading: the gate fails closed
    # Without gates nothing is pinned; a worker without the action is refused where the first gate is.
    plain = support.write_runbook(tmp_path, "metadata: {name: plain}\ntarget: t\nsteps:\n  - id: w\n    wait: 1s\n",
                                  name="plain")
    assert "telemetry.read" not in plan_run(plain, registry=support.registry()).actions
    with pytest.raises(RunbookInvalid) as caught:
        plan_run(file, registry=Registry())
    assert any(LOCATED.match(e) and "gates read through the telemetry.read action" in e for e in caught.value.errors)
