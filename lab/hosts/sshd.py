"""Debian's openssh-server inside lab hosts: host keys, client key, config, known_hosts, start."""

from __future__ import annotations

import os
from pathlib import Path

from activities.executors import HostTarget
from lab.hosts.processes import start_daemon, stop_daemon, wait_for_port
from lab.hosts.shell import sh
from lab.hosts.spec import LabSpec
from lab.hosts.state import DaemonRecord

__all__ = ["SSHD", "SshPaths", "setup_ssh", "ssh_target", "start_sshd", "stop_sshd"]

SSHD = "/usr/sbin/sshd"
SSH_PORT = 22


class SshPaths:
    """Where the lab keeps its SSH material (all under <state_dir>/ssh, mode 0700)."""

    def __init__(self, spec: LabSpec) -> None:
        self.root = Path(spec.state_dir).resolve() / "ssh"
        self.client_key = self.root / "client_ed25519"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"

    def host_dir(self, host: str) -> Path:
        return self.root / host

    def host_key(self, host: str) -> Path:
        return self.host_dir(host) / "ssh_host_ed25519_key"

    def config(self, host: str) -> Path:
        return self.host_dir(host) / "sshd_config"

    def pid_file(self, host: str) -> Path:
        return self.host_dir(host) / "sshd.pid"


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return  # reuse: known_hosts pins stay valid across re-runs of setup
    path.unlink(missing_ok=True)
    sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    path.write_text(text)
    os.chmod(path, mode)


def _sshd_config(spec: LabSpec, paths: SshPaths, host: str) -> str:
    return "\n".join([
        f"ListenAddress {spec.address(host)}:{SSH_PORT}",
        f"HostKey {paths.host_key(host)}",
        f"PidFile {paths.pid_file(host)}",
        f"AuthorizedKeysFile {paths.authorized_keys}",
        "PermitRootLogin prohibit-password",
        "AllowUsers root",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # StrictModes would reject key files below a world-writable dir such as /tmp (test state
        # dirs); the lab writes them itself with 0700/0600, which is what StrictModes checks for.
        "StrictModes no",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "PrintMotd no",
        "LogLevel VERBOSE",
        "",
    ])


def setup_ssh(spec: LabSpec) -> SshPaths:
    """Generate the client key, per-host host keys and configs, authorized_keys and known_hosts."""
    paths = SshPaths(spec)
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    _keygen(paths.client_key, "coldstart-lab-controller")
    client_pub = paths.client_key.with_suffix(".pub").read_text().strip()
    # Only the controller address may use the key, and only to run commands.
    _write(
        paths.authorized_keys,
        f'from="{spec.gateway}",no-port-forwarding,no-agent-forwarding,no-X11-forwarding {client_pub}\n',
    )
    known: list[str] = []
    for host in spec.ssh_hosts:
        paths.host_dir(host).mkdir(exist_ok=True)
        os.chmod(paths.host_dir(host), 0o700)
        _keygen(paths.host_key(host), f"coldstart-lab-{host}")
        key_type, key_b64 = paths.host_key(host).with_suffix(".pub").read_text().split()[:2]
        known.append(f"{spec.address(host)} {key_type} {key_b64}")
        _write(paths.config(host), _sshd_config(spec, paths, host))
    _write(paths.known_hosts, "\n".join(known) + "\n", 0o644)
    return paths


def start_sshd(spec: LabSpec, host: str, *, timeout: float = 10.0) -> DaemonRecord:
    """Run sshd in the foreground (-D) inside the host and wait until port 22 answers."""
    if host not in spec.ssh_hosts:
        raise ValueError(f"{host} is not one of the lab's ssh_hosts {spec.ssh_hosts}")
    paths = SshPaths(spec)
    if not paths.config(host).exists():
        setup_ssh(spec)
    sh([SSHD, "-t", "-f", str(paths.config(host))])  # config errors surface here, not as a timeout
    record = start_daemon(spec, host, "sshd", [SSHD, "-D", "-e", "-f", str(paths.config(host))])
    wait_for_port(str(spec.address(host)), SSH_PORT, timeout=timeout, pid=record.pid)
    return record


def stop_sshd(spec: LabSpec, host: str) -> bool:
    return stop_daemon(spec, host, "sshd")


def ssh_target(spec: LabSpec, host: str) -> HostTarget:
    """The production-path target (SSH, pinned host key) for a lab host."""
    paths = SshPaths(spec)
    return HostTarget(
        name=host,
        kind="ssh",
        address=str(spec.address(host)),
        port=SSH_PORT,
        user="root",
        key_path=str(paths.client_key),
        known_hosts=str(paths.known_hosts),
    )
