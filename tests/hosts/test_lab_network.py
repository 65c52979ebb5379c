"""Lab create/destroy: idempotent create, clean destroy, and recovery after a lost state file."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lab.hosts import create, destroy, leftovers, list_netns, start_daemon, stop_daemon
from lab.hosts.processes import pid_alive, restart_daemon
from lab.hosts.shell import ip_json, iptables
from lab.hosts.state import load_state, state_path
from tests.hosts.labkit import lab_spec, require_lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(60)]


def test_destroy_after_crash_sweeps_by_prefix(tmp_path: Path) -> None:
    require_lab()
    spec = lab_spec(tmp_path / "state", prefix="cs-crash", bridge="cscrashbr0", veth_prefix="cscv",
                    subnet="10.213.249.0/24", ssh_hosts=())  # no sshd: /run/sshd stays untouched
    try:
        create(spec)
        create(spec)  # idempotent: everything is reused
        assert sorted(n for n in list_netns() if spec.owns_netns(n)) == sorted(spec.netns(h) for h in spec.hosts)
        sleeper = start_daemon(spec, "nomad", "sleep", ["sleep", "300"])
        assert pid_alive(sleeper.pid)
        # Simulate a crash that also lost the state file: destroy must still find everything.
        state_path(spec.state_dir).unlink()
        removed = destroy(spec)
        assert any(r.startswith("process") for r in removed)
        assert leftovers(spec) == []
        assert not pid_alive(sleeper.pid, sleeper.starttime)
    finally:
        destroy(spec)


def test_restarts_at_once_keep_every_record(lab) -> None:
    # Agents restarted in one wave each run `lab.daemon_restart`; none may lose the others' new PIDs,
    # or the next restart kills a dead PID and starts a second daemon beside the live one.
    names = [f"sleeper{i}" for i in range(6)]
    for name in names:
        start_daemon(lab, "nomad", name, ["sleep", "300"])
    new = []
    for _ in range(3):
        with ThreadPoolExecutor(len(names)) as pool:
            new = list(pool.map(lambda n: restart_daemon(lab, "nomad", n), names))
        recorded = load_state(lab.state_dir).daemons
        assert [recorded[f"nomad/{n}"].pid for n in names] == [r.pid for r in new]
        assert all(pid_alive(r.pid, r.starttime) for r in new)
    for name in names:
        stop_daemon(lab, "nomad", name)
    assert not any(f"nomad/{n}" in load_state(lab.state_dir).daemons for n in names)
    assert not any(pid_alive(r.pid, r.starttime) for r in new)


def test_destroy_leaves_nothing(lab) -> None:  # runs last: it tears the shared module lab down
    state = load_state(lab.state_dir)
    pids = [(d.pid, d.starttime) for d in state.daemons.values()]
    assert any(d.name == "sshd" for d in state.daemons.values())
    destroy(lab)
    assert leftovers(lab) == []
    assert not [n for n in list_netns() if n.startswith(f"{lab.prefix}-")]
    assert not [link["ifname"] for link in ip_json("link", "show") if link["ifname"] == lab.bridge]
    assert not any(pid_alive(pid, start) for pid, start in pids)
    assert iptables("-S", lab.forward_chain, check=False).returncode != 0
    assert not state_path(lab.state_dir).exists()
    assert not (Path(lab.state_dir) / "ssh").exists()
