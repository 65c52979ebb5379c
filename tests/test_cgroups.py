"""The lab's CPU cgroups (lab/cgroups.py): the controller's weight, on the real kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab import cgroups
from lab.drills.harness import LabHarness
from tests.real import needs, unavailable

pytestmark = needs(os.geteuid() == 0, "cgroups need root")


def _cpu_controller() -> bool:
    try:
        cgroups.cgroup_root()
    except OSError:
        return False
    return True


@pytest.fixture
def group() -> str:
    if not _cpu_controller():
        unavailable("no cgroup CPU controller")
    name = f"coldstart-test-{os.getpid()}"
    yield name
    cgroups.release(name)


def test_weigh_gives_the_processes_and_their_later_children_the_weight_and_a_real_time_budget(group):
    """A weighed process's children start in its group, and may take a real-time policy there (a new v1 group has
    no real-time runtime: without one chrt is refused, as the kill's host script would be)."""
    shell = subprocess.Popen(["sh", "-c", "read go; chrt -f 1 true && echo rt; sleep 30 & echo $!; wait"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        path = cgroups.weigh(group, [shell.pid], 1000)
        if (path / "cpu.weight").exists():
            assert (path / "cpu.weight").read_text().strip() == "1000"
        else:
            assert (path / "cpu.shares").read_text().strip() == "10240"
        assert shell.stdin is not None and shell.stdout is not None
        shell.stdin.write("\n")
        shell.stdin.flush()
        answer = shell.stdout.readline().strip()
        if (path / "cpu.rt_runtime_us").exists():
            assert answer == "rt"
            assert (path / "cpu.rt_runtime_us").read_text().strip() == "200000"
            answer = shell.stdout.readline().strip()
        child = int(answer)
        assert sorted(cgroups.pids(group)) == sorted([shell.pid, child])
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)  # its sleep, before it is orphaned
        shell.kill()
        shell.wait()


def test_weigh_refuses_a_weight_out_of_range(group):
    for weight in (0, 10_001):
        with pytest.raises(ValueError, match="out of range 1..10000"):
            cgroups.weigh(group, [], weight)
    assert not (cgroups.cgroup_root() / group).exists()


def test_the_harness_weighs_the_controller_and_puts_it_back(tmp_path: Path):
    """weigh_controller moves the server's and the worker's processes into the lab's controller group, and with
    None back among every other process (the group is left empty, for the lab's teardown to remove)."""
    if not _cpu_controller():
        unavailable("no cgroup CPU controller")
    cfg = SimpleNamespace(prefix=f"cst{os.getpid()}", inventory_path=tmp_path / "targets" / "t.yaml")
    harness = LabHarness(tmp_path, cfg, "q")
    server, worker = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2))
    harness.server.process = server
    harness.worker = SimpleNamespace(pid=worker.pid)  # type: ignore[assignment] - only its pid is read
    try:
        assert harness.weigh_controller(1000) == [server.pid, worker.pid]
        assert sorted(cgroups.pids(harness.controller_cgroup)) == sorted([server.pid, worker.pid])
        assert sorted(harness.weigh_controller(None)) == sorted([server.pid, worker.pid])
        assert cgroups.pids(harness.controller_cgroup) == []
        root = (cgroups.cgroup_root() / "cgroup.procs").read_text().split()
        assert str(server.pid) in root and str(worker.pid) in root
    finally:
        for process in (server, worker):
            process.kill()
            process.wait()
        cgroups.release(harness.controller_cgroup)
