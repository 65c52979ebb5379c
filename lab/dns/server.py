"""Prepare a state dir, then start and stop pdns_server from it by PID, waiting until it answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype

from lab.dns.config import LaunchSpec, launch_spec
from lab.dns.policy import render_policy
from lab.dns.settings import PdnsPaths, PdnsSettings
from lab.dns.tsig import TsigKey, generate_key, load_key, save_key
from lab.dns.zone import create_database

__all__ = [
    "PdnsLab",
    "PdnsProcess",
    "free_dns_port",
    "prepare",
    "start",
    "stop",
    "tsig_key_material",
    "wait_until_answering",
]


@dataclass(frozen=True)
class PdnsLab:
    """A prepared instance: its settings, files and key. Start it with `start(lab)`."""

    settings: PdnsSettings
    paths: PdnsPaths

    @property
    def key(self) -> TsigKey:
        return load_key(self.paths.key)

    def launch(self) -> LaunchSpec:
        return launch_spec(self.settings, self.paths)


@dataclass
class PdnsProcess:
    """A running pdns_server we started; stop it with `stop()`, which only signals this PID."""

    lab: PdnsLab
    pid: int
    popen: subprocess.Popen[bytes] | None = None


def prepare(state_dir: Path | str, settings: PdnsSettings | None = None, *, key: TsigKey | None = None) -> PdnsLab:
    """Write pdns.conf, the policy script, a TSIG key and the sqlite zone into state_dir.

    A fresh key is generated unless `key` is given: pass one lab's key to the next to
    run several authoritative servers the controller updates with one secret.
    """
    settings = settings or PdnsSettings()
    paths = PdnsPaths(Path(state_dir).resolve())
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    # The dir holds the TSIG secret until the lab moves it to Vault.
    os.chmod(paths.state_dir, 0o700)
    if key is None:
        key = generate_key(settings.key_name)
    elif key.name.lower() != settings.key_name.lower():
        raise ValueError(f"key {key.name} does not match settings.key_name {settings.key_name}")
    save_key(key, paths.key)
    paths.policy.write_text(
        render_policy(key_name=key.name, zone=settings.zone, names=settings.steering_fqdns)
    )
    create_database(paths.database, settings, key)
    lab = PdnsLab(settings=settings, paths=paths)
    paths.conf.write_text(lab.launch().conf_text)
    return lab


def tsig_key_material(lab: PdnsLab) -> dict[str, str]:
    """{name, algorithm, secret} for the lab to write into Vault; don't log the result."""
    return lab.key.as_dict()


def free_dns_port(address: str = "127.0.0.1") -> int:
    """A port free on both UDP and TCP right now (pdns needs both)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for _ in range(50):
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.bind((address, 0))
            port = udp.getsockname()[1]
            with socket.socket(family, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind((address, port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free port found")


def _answers(settings: PdnsSettings) -> bool:
    query = dns.message.make_query(settings.zone, dns.rdatatype.SOA)
    try:
        reply = dns.query.udp(query, settings.bind_address, port=settings.port, timeout=0.2)
    except (OSError, dns.exception.Timeout):
        return False
    return reply.rcode() == dns.rcode.NOERROR and bool(reply.answer)


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until_answering(lab: PdnsLab, proc: PdnsProcess | None = None, timeout: float = 15.0) -> None:
    """Poll SOA until the zone answers; fail early (with the log tail) if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen is not None and proc.popen.poll() is not None:
            raise RuntimeError(
                f"pdns_server exited with {proc.popen.returncode}:\n{_log_tail(lab.paths.log)}"
            )
        if _answers(lab.settings):
            return
        time.sleep(0.05)
    raise TimeoutError(f"pdns_server not answering on {lab.settings.address}:\n{_log_tail(lab.paths.log)}")


def start(lab: PdnsLab, *, wrap: Sequence[str] = (), timeout: float = 15.0) -> PdnsProcess:
    """Start pdns_server in the foreground as our child; `wrap` prefixes argv (e.g. ip netns exec NS)."""
    argv = [*wrap, *lab.launch().argv]
    with open(lab.paths.log, "ab") as log:  # the child keeps its own copy
        popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    proc = PdnsProcess(lab=lab, pid=popen.pid, popen=popen)
    lab.paths.pid.write_text(f"{popen.pid}\n")
    try:
        # With `wrap` the lab may only reach the namespace from inside it; the caller then waits itself.
        if not wrap:
            wait_until_answering(lab, proc, timeout=timeout)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: PdnsProcess, timeout: float = 5.0) -> int | None:
    """SIGTERM this PID, SIGKILL if it lingers; returns the exit status when it was our child."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    rc: int | None = None
    if proc.popen is not None:
        try:
            rc = proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            rc = proc.popen.wait()
    else:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(proc.pid, signal.SIGKILL)
    proc.lab.paths.pid.unlink(missing_ok=True)
    return rc
