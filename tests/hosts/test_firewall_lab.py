"""firewall.* over the SSH executor against a real sshd and iptables inside lab namespaces."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.contracts.firewall import AllowInput, BlockInput, StatusInput, UnblockInput
from activities.executors import ExecutorError, SshExecutor, executor_for
from activities.firewall.actions import allow, block, revoke, status, unblock
from activities.firewall.rules import AllowTier
from lab.hosts import LabSpec, run_in_host, ssh_target, start_daemon
from lab.hosts.sshd import SshPaths
from tests.hosts.labkit import ECHO_PORT, HTTP_PORT, connect, connect_from

pytestmark = [pytest.mark.lab, pytest.mark.timeout(60)]

# Holds one connection open and writes how the last round trip went, so a test can watch an
# *existing* client get cut by the block (what the Roblox recovery needed from iptables).
HELD_CLIENT = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
out = sys.argv[3]
while True:
    try:
        conn.sendall(b"ping")
        state = "alive" if conn.recv(16) else "closed"
    except OSError as exc:
        state = type(exc).__name__
    with open(out + ".tmp", "w") as fh:
        fh.write(state)
    import os; os.replace(out + ".tmp", out)
    if state != "alive":
        break
    time.sleep(0.1)
"""


def _chain_rules(spec: LabSpec, host: str, chain: str = "COLDSTART-BLOCK") -> list[str]:
    proc = run_in_host(spec, host, ["iptables", "-S", chain])
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def _input_jumps(spec: LabSpec, host: str, chain: str = "COLDSTART-BLOCK") -> list[str]:
    proc = run_in_host(spec, host, ["iptables", "-S", "INPUT"])
    return [line for line in proc.stdout.splitlines() if line.endswith(f"-j {chain}")]


def _wait_file(path: Path, want: str, timeout: float = 5.0) -> str:
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        seen = path.read_text() if path.exists() else ""
        if seen == want:
            break
        time.sleep(0.05)
    return seen


async def test_ssh_executor_runs_commands_with_pinned_key(lab: LabSpec) -> None:
    async with executor_for(ssh_target(lab, "consul1")) as ex:
        rc, out, err = await ex.run(["sh", "-c", 'printf "%s|" "$1" "$(id -u)"', "sh", "it's; $(not expanded)"])
    assert (rc, out) == (0, "it's; $(not expanded)|0|"), err


async def test_ssh_executor_refuses_unknown_host_key(lab: LabSpec, tmp_path: Path) -> None:
    paths = SshPaths(lab)
    # Pin a different key for the address: the connection must fail, not fall back to trusting it.
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{lab.address('consul1')} {paths.client_key.with_suffix('.pub').read_text()}")
    ex = SshExecutor(str(lab.address("consul1")), key_path=paths.client_key, known_hosts=wrong, name="consul1")
    with pytest.raises(ExecutorError, match="consul1") as info:
        await ex.run(["true"])
    assert info.value.retryable is False  # retrying cannot fix a host key mismatch
    await ex.close()


def test_lab_hosts_reach_each_other(lab: LabSpec) -> None:
    addr = str(lab.address("consul1"))
    assert connect_from(lab, "players", addr, HTTP_PORT) == "connected"
    assert connect(addr, HTTP_PORT) == "connected"  # controller = bridge address in the root ns
    # No default route in a lab host: anything outside the lab subnet is unreachable.
    out = run_in_host(lab, "players", ["ip", "route", "get", "192.0.2.1"])
    assert out.returncode != 0


async def test_block_allow_unblock(lab: LabSpec) -> None:
    addr = str(lab.address("consul1"))
    target = ssh_target(lab, "consul1")
    controller = AllowTier(name="controller", cidrs=[f"{lab.gateway}/32"])
    block_in = BlockInput(hosts=[target], ports=[ECHO_PORT, HTTP_PORT], allow=[controller])

    held = Path(lab.state_dir) / "held-client.state"
    start_daemon(lab, "players", "held", [sys.executable, "-c", HELD_CLIENT, addr, str(ECHO_PORT), str(held)])
    assert _wait_file(held, "alive") == "alive"

    first = await block(block_in)
    assert first.changed_hosts == ["consul1"]
    assert any("created chain COLDSTART-BLOCK" in a for a in first.hosts[0].actions)
    # Players are refused, including the connection that was already open; the controller is not.
    assert connect_from(lab, "players", addr, HTTP_PORT) == "refused"
    assert _wait_file(held, "ConnectionResetError") == "ConnectionResetError"
    assert connect(addr, HTTP_PORT) == "connected"
    assert connect_from(lab, "consul1", addr, HTTP_PORT) == "connected"  # own address goes via lo

    rules_before = _chain_rules(lab, "consul1")
    second = await block(block_in)
    assert second.changed_hosts == [] and second.hosts[0].changed is False
    assert second.hosts[0].actions == []
    assert _chain_rules(lab, "consul1") == rules_before
    assert len(_input_jumps(lab, "consul1")) == 1

    players = AllowTier(name="players", cidrs=[f"{lab.address('players')}/32"])
    allowed = await allow(AllowInput(hosts=[target], tier=players))
    assert allowed.changed_hosts == ["consul1"]
    assert allowed.hosts[0].actions == [f"allowed {lab.address('players')}/32 (players)"]
    assert connect_from(lab, "players", addr, HTTP_PORT) == "connected"
    assert connect_from(lab, "nomad", addr, HTTP_PORT) == "refused"  # a tier not yet let in
    again = await allow(AllowInput(hosts=[target], tier=players))
    assert again.changed_hosts == []

    report = await status(StatusInput(hosts=[target]))
    st = report.hosts[0]
    assert st.blocked and st.jump_first and st.rejects and st.loopback and not st.problems
    assert st.ports == [ECHO_PORT, HTTP_PORT]
    assert st.tiers == {"controller": [f"{lab.gateway}/32"], "players": [f"{lab.address('players')}/32"]}

    # The allow's own undo input takes just that tier back out.
    revoked = await revoke(allowed.undo)
    assert revoked.changed_hosts == ["consul1"]
    assert connect_from(lab, "players", addr, HTTP_PORT) == "refused"

    done = await unblock(first.undo)
    assert done.changed_hosts == ["consul1"]
    assert _chain_rules(lab, "consul1") == [] and _input_jumps(lab, "consul1") == []
    assert connect_from(lab, "players", addr, HTTP_PORT) == "connected"
    assert connect_from(lab, "nomad", addr, ECHO_PORT) == "connected"
    assert (await unblock(UnblockInput(hosts=[target]))).changed_hosts == []


async def test_block_repairs_a_jump_pushed_below_an_established_accept(lab: LabSpec) -> None:
    target = ssh_target(lab, "consul1")
    inp = BlockInput(hosts=[target], ports=[HTTP_PORT], allow=[f"{lab.gateway}/32"])
    await block(inp)
    try:
        # Someone inserts a conntrack accept at the top of INPUT: existing clients would slip through.
        run_in_host(lab, "consul1", ["iptables", "-I", "INPUT", "1", "-m", "conntrack",
                                     "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"], check=True)
        assert (await status(StatusInput(hosts=[target]))).hosts[0].jump_first is False
        fixed = await block(inp)
        assert fixed.changed_hosts == ["consul1"]
        assert run_in_host(lab, "consul1", ["iptables", "-S", "INPUT"]).stdout.splitlines()[1].endswith(
            "-j COLDSTART-BLOCK")
        assert len(_input_jumps(lab, "consul1")) == 1
    finally:
        await unblock(UnblockInput(hosts=[target]))
        run_in_host(lab, "consul1", ["iptables", "-F", "INPUT"])


async def test_partial_failure_names_changed_hosts(lab: LabSpec) -> None:
    good = ssh_target(lab, "consul1")
    # nomad runs no sshd: connecting fails, and the error must say consul1 was changed anyway.
    dead = good.model_copy(update={"name": "nomad", "address": str(lab.address("nomad"))})
    try:
        with pytest.raises(ApplicationError) as info:
            await block(BlockInput(hosts=[good, dead], ports=[HTTP_PORT], allow=[f"{lab.gateway}/32"]))
        err = info.value
        assert "failed on nomad" in err.message and "changed: consul1" in err.message
        assert err.details[0]["changed_hosts"] == ["consul1"]
        assert list(err.details[0]["failed_hosts"]) == ["nomad"]
        assert not err.non_retryable  # a connect failure may heal; every step is idempotent
    finally:
        await unblock(UnblockInput(hosts=[good]))
