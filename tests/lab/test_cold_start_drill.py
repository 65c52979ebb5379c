"""The cold-start drill end to end: the seed outage injected on a lab of its own, recovered by one runbook."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from tests.lab.conftest import _skip_reason

# Apart from the session lab (cst/10.214) and a developer's lab (cs/10.213).
DRILL_LAB = dict(prefix="csd", bridge="csdbr0", veth_prefix="csdv", subnet="10.215.0.0/24")


@pytest.fixture(scope="module")
def drill_report(tmp_path_factory):
    if reason := _skip_reason():
        pytest.skip(reason)
    import asyncio

    from cli.lab_drill import run_lab_drill

    state = tmp_path_factory.mktemp("drill")
    console = Console(file=(state / "console.txt").open("w"), width=120)
    return asyncio.run(run_lab_drill("consul-cold-start", state, console, lab=DRILL_LAB)), state


def test_drill_recovers_to_full_service(drill_report):
    report, state = drill_report
    console = (state / "console.txt").read_text()
    assert report.outcome == "succeeded", console[-3000:]
    steps = dict(report.phases)
    for step in ("block-consul", "restore", "move-leader", "disable-users", "unblock", "redeploy-cache",
                 "players", "enable-users", "close"):
        assert step in steps, f"{step} never ran"
    # The players reached 100 % and were admitted there (measured by the players generator).
    assert report.ramp and report.ramp[-1][0] == 100 and report.ramp[-1][1] > 95
    gates = {(step, gate) for step, gate, readings, passed, _ in report.gates if passed}
    for gate in ("cache-hit-ratio", "db-load", "edge-errors", "consul-kv-apply", "admitted-on-target"):
        assert ("players", gate) in gates
    assert ("consul-healthy", "kv-apply-p50") in gates or ("kv-apply", "kv-apply-p50") in gates


def test_drill_report_files(drill_report):
    report, state = drill_report
    markdown = report.report_path.read_text()
    assert "restore" in markdown and "players" in markdown
    assert report.plot_path is not None and report.plot_path.read_bytes()[:4] == b"\x89PNG"
    # The lab was taken down: no namespace of the drill's prefix is left.
    import subprocess

    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [line for line in names.splitlines() if line.startswith(DRILL_LAB["prefix"] + "-")]
    assert Path(state / "lab").exists()
