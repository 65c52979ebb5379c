"""`down` leaves nothing behind, also after a crash mid-`up`."""

from __future__ import annotations

import subprocess

import pytest

from lab.settings import LabConfig
from tests.lab.conftest import _real_agents_reason, _skip_reason
from tests.real import unavailable

pytestmark = pytest.mark.timeout(300)  # runs `lab up` twice; each daemon may take up to 60 s on a loaded host


def _pids_in(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{prefix}-")]


def test_up_down_leaves_nothing(tmp_path):
    if reason := _skip_reason() or _real_agents_reason():
        unavailable(reason)
    from lab.hosts.processes import pid_alive
    from lab.hosts.state import load_state
    from lab.lifecycle import down, up

    cfg = LabConfig(state_dir=tmp_path / "state", inventory_path=tmp_path / "lab.yaml", prefix="csu",
                    bridge="csubr0", veth_prefix="csuv", subnet="10.218.0.0/24")
    try:
        info = up(cfg)
        daemons = list(load_state(cfg.state_dir).daemons.values())
        assert all(how.startswith("real") for how in info["backends"].values()), info["backends"]
        # 3 sshd, pdns, postgres, prometheus, alertmanager, edge, session router, 3 node agents, 2 loads;
        # Consul: 3 servers + 2 client agents (internal, edge: lab.agents.CONSUL_CLIENT_HOSTS) + the cgroup
        # exporter + the KV canary; Nomad: a server + 4 clients; Vault: 1.
        want = 14 + 7 + 5 + 1
        assert len(daemons) == want, sorted(f"{d.host}/{d.name}" for d in daemons)
        up(cfg)  # idempotent: a second up keeps the same daemons
        assert {d.pid for d in load_state(cfg.state_dir).daemons.values()} == {d.pid for d in daemons}
    finally:
        removed = down(cfg)
    assert removed
    assert not _pids_in(cfg.prefix)
    from lab.containers import cgroup_root, sessions_cgroup

    # The session containers (their own process trees, outliving a killed agent) and their cgroups are gone.
    assert not (cgroup_root() / sessions_cgroup(cfg.prefix)).exists()
    assert not any(pid_alive(d.pid, d.starttime) for d in daemons)
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    assert cfg.bridge not in rules and f"CSLAB-{cfg.bridge}" not in rules
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert cfg.bridge not in links and cfg.veth_prefix not in links
    assert not cfg.inventory_path.exists()
    # Only the documented leftovers: the logs for the post-mortem.
    assert sorted(p.name for p in cfg.state_dir.iterdir()) == ["logs"]


def test_down_after_crash_without_state_file(tmp_path):
    if reason := _skip_reason():
        unavailable(reason)
    from lab.hosts.state import state_path
    from lab.lifecycle import down, up

    cfg = LabConfig(state_dir=tmp_path / "state", inventory_path=tmp_path / "lab.yaml", prefix="csx",
                    bridge="csxbr0", veth_prefix="csxv", subnet="10.219.0.0/24")
    try:
        up(cfg)
        state_path(cfg.state_dir).unlink()  # the crash lost the record of what runs
    finally:
        down(cfg)
    assert not _pids_in(cfg.prefix)
    assert cfg.bridge not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
