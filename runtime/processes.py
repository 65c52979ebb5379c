"""Local processes: started in their own session and stopped by group, ports waited on, daemons by PID and start time (a recycled PID is never signalled)."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

__all__ = ["adopt", "free_port", "kill_pid", "pid_alive", "process_starttime", "start_process", "stop_process", "wait_port"]

# Popen objects of daemons this process started, kept so they can be reaped (no zombies,
# no "subprocess still running" warnings).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def adopt(process: subprocess.Popen[bytes]) -> None:
    """Keep a daemon this process started, to reap it once it is stopped or found gone."""
    _CHILDREN[process.pid] = process


def process_starttime(pid: int) -> float | None:
    """When the process started (psutil's create_time); None if it is gone or a zombie."""
    try:
        process = psutil.Process(pid)
        if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            _reap(pid)
            return None
        return process.create_time()
    except psutil.NoSuchProcess:
        return None


def pid_alive(pid: int, starttime: float | None = None) -> bool:
    """The PID runs, and is still the process started at `starttime` (a recycled PID is not)."""
    current = process_starttime(pid)
    return current is not None and (starttime is None or abs(current - starttime) < 0.01)


def kill_pid(pid: int, starttime: float | None = None, *, grace: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL after `grace`; only if the PID still names the same process."""
    if not pid_alive(pid, starttime):
        _reap(pid)
        return False
    try:
        process = psutil.Process(pid)
        process.terminate()
        if not _gone(pid, starttime, grace):
            process.kill()
            _gone(pid, starttime, 2.0)
    except psutil.NoSuchProcess:
        pass
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    proc = _CHILDREN.pop(pid, None)
    if proc is not None:
        proc.poll()
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent reaps it


def _gone(pid: int, starttime: float | None, timeout: float) -> bool:
    # pid_alive, not psutil's wait: it reaps our own children and counts a zombie as gone.
    waiting = Retrying(retry=retry_if_result(bool), stop=stop_after_delay(timeout), wait=wait_fixed(0.05),
                       retry_error_callback=lambda state: bool(state.outcome and state.outcome.result()))
    return not waiting(pid_alive, pid, starttime)


_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=256)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the caller binds it soon after), and none of the last 256 this
    process handed out: a stack asks for a dozen before it binds any, and the kernel may give one twice."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


def wait_port(port: int, *, host: str = "127.0.0.1", timeout: float = 30.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            program = process.args[0] if isinstance(process.args, (list, tuple)) else process.args
            raise RuntimeError(f"{program} exited with {process.returncode} before listening on {port}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout:.0f} s")


@contextmanager
def start_process(argv: list[str], *, log: Path, port: int | None = None, timeout: float = 30.0) -> Iterator[subprocess.Popen]:
    """Start a process in its own session, wait for its port, and always stop it (TERM, then KILL)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if port is not None:
            wait_port(port, timeout=timeout, process=process)
        yield process
    finally:
        stop_process(process, grace=10)


def stop_process(process: subprocess.Popen | None, *, grace: float) -> None:
    """SIGTERM the process group, SIGKILL after `grace` seconds."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
