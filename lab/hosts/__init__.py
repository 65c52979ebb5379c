"""Lab hosts as network namespaces on a private bridge, with sshd on the Consul servers."""

from __future__ import annotations

from lab.hosts.network import create, destroy, leftovers, list_netns
from lab.hosts.processes import run_in_host, start_daemon, stop_daemon, wait_for_port
from lab.hosts.shell import LabError, netns_usable
from lab.hosts.spec import DEFAULT_HOSTS, DEFAULT_SSH_HOSTS, LabSpec
from lab.hosts.sshd import setup_ssh, ssh_target, start_sshd, stop_sshd

__all__ = [
    "DEFAULT_HOSTS",
    "DEFAULT_SSH_HOSTS",
    "LabError",
    "LabSpec",
    "create",
    "destroy",
    "leftovers",
    "list_netns",
    "netns_usable",
    "run_in_host",
    "setup_ssh",
    "ssh_target",
    "start_daemon",
    "start_sshd",
    "stop_daemon",
    "stop_sshd",
    "wait_for_port",
]
