"""Two labs on one prefix: `up` refuses a lab someone still runs and sweeps one whose owner ended without `down`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.hosts import LabError, create, leftovers, start_daemon
from lab.hosts.processes import pid_alive
from lab.hosts.tenancy import occupant, record_owner
from lab.settings import LabConfig
from tests.hosts.labkit import require_lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

_LAB = {"prefix": "csy", "bridge": "csybr0", "veth_prefix": "csyv", "subnet": "10.230.0.0/24"}


def _config(where: Path) -> LabConfig:
    return LabConfig(state_dir=where / "state", inventory_path=where / "lab.yaml", **_LAB)


@pytest.fixture
def labs(tmp_path: Path) -> Iterator[tuple[LabConfig, LabConfig]]:
    """The first lab's namespaces with one marked daemon in them (a killed session's lab in miniature), and the
    config of a second lab on the same prefix."""
    require_lab()
    from lab.lifecycle import down

    first, second = _config(tmp_path / "first"), _config(tmp_path / "second")
    create(first.spec)
    try:
        yield first, second
    finally:
        down(first)
        assert leftovers(first.spec) == []


def test_a_lab_its_owner_still_runs_is_refused_and_left_alone(labs):
    from lab.lifecycle import down, up

    first, second = labs
    # An unmarked process (started by hand) belongs to no lab: the prefix is free.
    stray = subprocess.Popen(["ip", "netns", "exec", first.spec.netns("nomad"), "sleep", "300"])
    try:
        assert occupant(second.spec) is None
    finally:
        stray.kill()
        stray.wait()
    daemon = start_daemon(first.spec, "nomad", "sleeper", ["sleep", "300"])
    record_owner(first.path(), os.getpid())  # this test's process: alive
    assert occupant(first.spec) is None  # a lab is never its own occupant

    with pytest.raises(LabError) as refused:
        up(second)
    message = str(refused.value)
    assert f"lab csy is already up from another state dir: the lab in {first.path()}" in message
    assert "owner pid" in message and "running" in message
    assert f"coldstart lab down --state-dir {first.path()}" in message
    assert not second.path().exists()  # refused before it made anything

    # The refused lab's `down` (a harness closing after a failed `up`) keeps the running lab's namespaces.
    said = down(second)
    assert said[-1].startswith("kept namespaces of prefix csy: the lab in ")
    assert pid_alive(daemon.pid, daemon.starttime)
    assert any(item.startswith("netns csy-") for item in leftovers(first.spec))


def test_a_lab_whose_owner_ended_is_swept_before_the_next_one_claims_the_prefix(labs):
    from lab.lifecycle import claim

    first, second = labs
    daemon = start_daemon(first.spec, "nomad", "sleeper", ["sleep", "300"])
    owner = subprocess.Popen(["sleep", "30"])
    record_owner(first.path(), owner.pid)
    owner.kill()
    owner.wait()  # the owner ended without taking its lab down, as a killed test session does

    found = occupant(second.spec)
    assert found is not None and found.state_dir == first.path() and found.abandoned
    assert daemon.pid in found.pids
    claim(second)
    assert not pid_alive(daemon.pid, daemon.starttime)
    assert leftovers(first.spec) == []
    assert occupant(second.spec) is None


def test_a_lab_left_up_on_purpose_has_no_owner_and_is_refused(labs):
    from lab.lifecycle import claim

    first, second = labs
    daemon = start_daemon(first.spec, "nomad", "sleeper", ["sleep", "300"])
    record_owner(first.path(), None)  # `coldstart lab up`
    with pytest.raises(LabError, match="no owner: left up on purpose"):
        claim(second)
    assert pid_alive(daemon.pid, daemon.starttime)
