"""Daemons inside lab hosts: start with `ip netns exec`, record PID + start time, stop by PID."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from lab.hosts.spec import LabSpec
from lab.hosts.state import DaemonRecord, load_state, updating_state
from lab.hosts.tenancy import daemon_env
from runtime.processes import adopt, kill_pid, pid_alive, process_starttime

__all__ = [
    "kill_pid",
    "pid_alive",
    "process_starttime",
    "restart_daemon",
    "run_in_host",
    "start_daemon",
    "stop_daemon",
    "wait_for_port",
]


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


def start_daemon(spec: LabSpec, host: str, name: str, argv: list[str], *, host_sysfs: bool = False) -> DaemonRecord:
    """Start argv in the host's namespace, detached, logging to the state dir; PID is recorded.

    host_sysfs: enter only the network namespace (nsenter), keeping the machine's /sys and its
    cgroup mounts, which `ip netns exec` replaces with a fresh sysfs.
    """
    if host not in spec.hosts:
        raise KeyError(f"unknown lab host {host!r}")
    key = f"{host}/{name}"
    log_dir = Path(spec.state_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{host}-{name}.log"
    with updating_state(spec.state_dir) as state:
        old = state.daemons.get(key)
        if old and pid_alive(old.pid, old.starttime):
            return old  # idempotent: the same daemon is already running
        with open(log, "ab") as sink:
            # `ip netns exec` and nsenter exec argv in place, so the Popen PID is the daemon's PID.
            enter = ["nsenter", f"--net=/run/netns/{spec.netns(host)}"] if host_sysfs else [
                "ip", "netns", "exec", spec.netns(host)]
            proc = subprocess.Popen(
                [*enter, *argv],
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for the test runner must not hit daemons
                env=daemon_env(spec),  # marked with its lab: another lab on the same prefix is told apart
            )
        adopt(proc)
        starttime = process_starttime(proc.pid) or 0
        record = DaemonRecord(host=host, name=name, pid=proc.pid, starttime=starttime, argv=argv, log=str(log))
        state.daemons[key] = record
    return record


def stop_daemon(spec: LabSpec, host: str, name: str) -> bool:
    """Stop a recorded daemon by PID; True if it was running."""
    key = f"{host}/{name}"
    record = load_state(spec.state_dir).daemons.get(key)
    if record is None:
        return False
    # Killed outside the lock (it may take seconds), forgotten under it, and only if nobody restarted it since.
    was_running = kill_pid(record.pid, record.starttime)
    with updating_state(spec.state_dir) as state:
        if (now := state.daemons.get(key)) is not None and now.pid == record.pid:
            del state.daemons[key]
    return was_running


class _NotYet(Exception):
    pass


def wait_for_port(address: str, port: int, *, timeout: float = 10.0, pid: int | None = None,
                  log: str | Path | None = None) -> None:
    """Connect from the root namespace until something listens; fail fast if `pid` died.

    With `log` (the daemon's), the error ends with its last lines: what it was doing when it gave up.
    """

    def attempt() -> None:
        if pid is not None and not pid_alive(pid):
            raise RuntimeError(f"process {pid} exited before {address}:{port} was listening{_log_tail(log)}")
        try:
            socket.create_connection((address, port), timeout=0.5).close()
        except OSError as exc:
            raise _NotYet(repr(exc)) from None

    retrying = Retrying(retry=retry_if_exception_type(_NotYet), stop=stop_after_delay(timeout), wait=wait_fixed(0.05),
                        reraise=True)
    try:
        retrying(attempt)
    except _NotYet as exc:
        raise TimeoutError(f"{address}:{port} not listening after {timeout}s: {exc}{_log_tail(log)}") from None


def _log_tail(log: str | Path | None, lines: int = 5) -> str:
    if log is None:
        return ""
    try:
        tail = Path(log).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"; {log} ends: " + " | ".join(tail) if tail else f"; {log} is empty"


def restart_daemon(spec: LabSpec, host: str, name: str) -> DaemonRecord:
    """Stop a recorded daemon and start it again with the argv it was started with (as a service manager would)."""
    record = load_state(spec.state_dir).daemons.get(f"{host}/{name}")
    if record is None:
        raise KeyError(f"no daemon {name!r} recorded on lab host {host!r}")
    stop_daemon(spec, host, name)
    return start_daemon(spec, host, name, record.argv)
