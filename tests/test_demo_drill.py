"""`coldstart drill demo`: a dev server, a worker and Debian's Prometheus; the demo runbook run as a drill ends with
its scorecard, kept for `coldstart report --file`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.real import needs

REPO = Path(__file__).resolve().parents[1]

pytestmark = needs(shutil.which("prometheus") or Path("/usr/bin/prometheus").exists(),
                   "Debian's prometheus is not installed (make test installs it)")


def _coldstart(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env, check=False)


def test_demo_drill_prints_and_keeps_its_scorecard(tmp_path):
    state = tmp_path / "drill"
    drill = _coldstart("drill", "demo", "--state-dir", str(state))
    assert drill.returncode == 0, (drill.stdout[-3000:], drill.stderr[-3000:])
    assert "scorecard: demo on local (succeeded" in drill.stdout, drill.stdout[-3000:]
    assert f"scorecard kept in {state / 'scorecards.jsonl'}" in drill.stdout.replace("\n", ""), drill.stdout[-1000:]
    [kept] = [json.loads(line) for line in (state / "scorecards.jsonl").read_text().splitlines()]
    assert kept["outcome"] == "succeeded" and kept["target"] == "local" and kept["runbook"] == "demo"
    assert [p["name"] for p in kept["phases"]] == ["ready", "approved", "checked", "ramped"]
    assert all(p["measured_s"] is not None and p["met"] for p in kept["phases"]), kept["phases"]
    # The demo's `settle` wait is the `checked` phase's bake.
    assert 1.9 <= kept["phases"][2]["bakes_s"] < 3.0, kept["phases"][2]

    png = tmp_path / "trend.png"
    report = _coldstart("report", "--target", "local", "--file", str(state / "scorecards.jsonl"), "--png", str(png))
    assert report.returncode == 0, report.stderr
    assert "ready" in report.stdout and "succeeded" in report.stdout, report.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    broken = tmp_path / "broken.jsonl"
    broken.write_text((state / "scorecards.jsonl").read_text() + "{not json\n")
    refused = _coldstart("report", "--target", "local", "--file", str(broken))
    assert refused.returncode == 2 and f"{broken}:2: not a kept scorecard" in refused.stderr, refused.stderr
