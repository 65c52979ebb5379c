"""The lab's commands reach `coldstart` through the package's entry points, so the controller never imports the lab."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _coldstart(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "100"}, check=False)


def test_the_lab_group_is_mounted_from_its_entry_point():
    listed = _coldstart("--help")
    assert listed.returncode == 0 and " lab " in listed.stdout, listed.stdout
    lab = _coldstart("lab", "--help")
    assert lab.returncode == 0, lab.stderr
    for command in ("up", "down", "status", "inject"):
        assert f" {command} " in lab.stdout, lab.stdout


def test_an_unknown_drill_names_the_drills_there_are():
    done = _coldstart("drill", "no-such-drill")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: no drill named 'no-such-drill' (available: demo, consul-cold-start)"


def test_commands_other_than_the_lab_load_no_lab_module():
    probe = ("import sys; sys.argv = ['coldstart', 'validate', 'runbooks/demo.yaml']\n"
             "from cli import main\n"
             "code = main._run()\n"
             "assert code == 0, code\n"
             "print(sorted(m for m in sys.modules if m == 'lab' or m.startswith('lab.')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
