"""Daemons inside lab hosts: start with `ip netns exec`, record PID + start time, stop by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from lab.hosts.spec import LabSpec
from lab.hosts.state import DaemonRecord, load_state, save_state

__all__ = [
    "kill_pid",
    "pid_alive",
    "process_starttime",
    "run_in_host",
    "start_daemon",
    "stop_daemon",
    "wait_for_port",
]

# Popen objects of daemons this process started, kept so they can be reaped (no zombies,
# no "subprocess still running" warnings).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def run_in_host(
    spec: LabSpec, host: str, argv: list[str], *, check: bool = False, input: str | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run argv in the host's namespace and wait for it."""
    if host not in spec.hosts:
        raise KeyError(f"unknown lab host {host!r}")
    return subprocess.run(
        ["ip", "netns", "exec", spec.netns(host), *argv],
        input=input, capture_output=True, text=True, timeout=timeout, check=check,
    )


def process_starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot); None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may contain spaces and parens; everything after the last ')' is fixed.
    fields = raw[raw.rfind(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        _reap(pid)
        return None
    return int(fields[19])


def pid_alive(pid: int, starttime: int | None = None) -> bool:
    current = process_starttime(pid)
    return current is not None and (starttime is None or current == starttime)


def _reap(pid: int) -> None:
    proc = _CHILDREN.pop(pid, None)
    if proc is not None:
        proc.poll()
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent reaps it


def kill_pid(pid: int, starttime: int | None = None, *, grace: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL after `grace`; only if the PID still names the same process."""
    if not pid_alive(pid, starttime):
        _reap(pid)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid, starttime):
            return True
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    for _ in range(100):
        _reap(pid)
        if not pid_alive(pid, starttime):
            break
        time.sleep(0.02)
    return True


def start_daemon(spec: LabSpec, host: str, name: str, argv: list[str], *, host_sysfs: bool = False) -> DaemonRecord:
    """Start argv in the host's namespace, detached, logging to the state dir; PID is recorded.

    host_sysfs: enter only the network namespace (nsenter), keeping the machine's /sys and its
    cgroup mounts, which `ip netns exec` replaces with a fresh sysfs.
    """
    if host not in spec.hosts:
        raise KeyError(f"unknown lab host {host!r}")
    key = f"{host}/{name}"
    state = load_state(spec.state_dir)
    old = state.daemons.get(key)
    if old and pid_alive(old.pid, old.starttime):
        return old  # idempotent: the same daemon is already running
    log_dir = Path(spec.state_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{host}-{name}.log"
    with open(log, "ab") as sink:
        # `ip netns exec` and nsenter exec argv in place, so the Popen PID is the daemon's PID.
        enter = ["nsenter", f"--net=/run/netns/{spec.netns(host)}"] if host_sysfs else [
            "ip", "netns", "exec", spec.netns(host)]
        proc = subprocess.Popen(
            [*enter, *argv],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for the test runner must not hit daemons
        )
    _CHILDREN[proc.pid] = proc
    starttime = process_starttime(proc.pid) or 0
    record = DaemonRecord(host=host, name=name, pid=proc.pid, starttime=starttime, argv=argv, log=str(log))
    state.daemons[key] = record
    save_state(spec.state_dir, state)
    return record


def stop_daemon(spec: LabSpec, host: str, name: str) -> bool:
    """Stop a recorded daemon by PID; True if it was running."""
    key = f"{host}/{name}"
    state = load_state(spec.state_dir)
    record = state.daemons.pop(key, None)
    if record is None:
        return False
    was_running = kill_pid(record.pid, record.starttime)
    save_state(spec.state_dir, state)
    return was_running


def wait_for_port(address: str, port: int, *, timeout: float = 10.0, pid: int | None = None) -> None:
    """Connect from the root namespace until something listens; fail fast if `pid` died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if pid is not None and not pid_alive(pid):
            raise RuntimeError(f"process {pid} exited before {address}:{port} was listening")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise TimeoutError(f"{address}:{port} not listening after {timeout}s: {last!r}")
