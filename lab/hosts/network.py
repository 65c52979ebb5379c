"""Build and tear down the lab network: a bridge, one netns + veth per host, a FORWARD guard."""

from __future__ import annotations

import ipaddress
import os
import shutil
from pathlib import Path

from lab.hosts.processes import kill_pid, process_starttime
from lab.hosts.shell import LabError, ip, ip_json, iptables, sh
from lab.hosts.spec import LabSpec
from lab.hosts.state import LabState, forget_state, load_state, save_state

__all__ = ["create", "destroy", "leftovers", "list_netns"]


def list_netns() -> list[str]:
    return [entry["name"] for entry in ip_json("netns", "list")]


def _link_exists(name: str) -> bool:
    return ip("link", "show", "dev", name, check=False).returncode == 0


def _links() -> list[str]:
    return [entry["ifname"] for entry in ip_json("link", "show")]


def _netns_sh(ns: str, *argv: str, check: bool = True) -> None:
    sh(["ip", "netns", "exec", ns, *argv], check=check)


def _check_subnet_free(spec: LabSpec) -> None:
    # The range must exist only on our bridge: refuse if any other device already routes it.
    for route in ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst")
        if not dst or dst == "default" or route.get("dev") == spec.bridge:
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.version == 4 and net.prefixlen > 0 and net.overlaps(spec.subnet):
            raise LabError(f"{spec.subnet} overlaps {dst} on {route.get('dev')}; pick another lab subnet")


def _ensure_bridge(spec: LabSpec) -> None:
    if not _link_exists(spec.bridge):
        ip("link", "add", "name", spec.bridge, "type", "bridge")
    # No IPv6 on the lab: nothing should leave it, and the firewall activities are IPv4-only.
    sh(["sysctl", "-qw", f"net.ipv6.conf.{spec.bridge}.disable_ipv6=1"], check=False)
    ip("addr", "replace", f"{spec.gateway}/{spec.subnet.prefixlen}", "dev", spec.bridge)
    ip("link", "set", spec.bridge, "up")


def _ensure_host(spec: LabSpec, state: LabState, host: str) -> None:
    ns, veth = spec.netns(host), spec.veth_name(host)
    state.remember("netns", ns)
    state.remember("veths", veth)
    save_state(spec.state_dir, state)  # record first: a crash right after `add` is still cleaned
    if ns not in list_netns():
        ip("netns", "add", ns)
    _netns_sh(ns, "ip", "link", "set", "lo", "up")
    _netns_sh(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", check=False)
    peer_ok = sh(["ip", "netns", "exec", ns, "ip", "link", "show", "dev", "eth0"], check=False).returncode == 0
    if _link_exists(veth) and not peer_ok:
        ip("link", "del", veth)  # half of a pair from an older run: rebuild it whole
    if not _link_exists(veth):
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", veth, "master", spec.bridge, "up")
    _netns_sh(ns, "ip", "addr", "replace", spec.cidr(host), "dev", "eth0")
    _netns_sh(ns, "ip", "link", "set", "eth0", "up")
    # Deliberately no default route: a lab host can reach only the lab subnet.


def _forward_rules(spec: LabSpec) -> str:
    chain = spec.forward_chain
    return "\n".join([
        "*filter",
        f":{chain} - [0:0]",
        f"-F {chain}",
        # Host-to-host frames cross the bridge (and FORWARD, with br_netfilter): let them through
        # even if the machine's FORWARD policy is DROP ...
        f"-A {chain} -o {spec.bridge} -m comment --comment \"coldstart lab\" -j ACCEPT",
        # ... and never route anything from the lab to another interface.
        f"-A {chain} -m comment --comment \"coldstart lab\" -j DROP",
        "COMMIT",
        "",
    ])


def _ensure_forward_guard(spec: LabSpec, state: LabState) -> None:
    state.forward_chain = spec.forward_chain
    save_state(spec.state_dir, state)
    sh(["iptables-restore", "-w", "5", "--noflush"], input=_forward_rules(spec))
    jump = ["FORWARD", "-i", spec.bridge, "-j", spec.forward_chain]
    if iptables("-C", *jump, check=False).returncode != 0:
        iptables("-I", jump[0], "1", *jump[1:])


def _ensure_privsep_dir(state: LabState) -> None:
    # Debian's sshd refuses to start without /run/sshd (systemd normally creates it).
    path = Path("/run/sshd")
    if not path.exists():
        path.mkdir(mode=0o755)
        state.created_privsep_dir = True


def create(spec: LabSpec) -> LabState:
    """Create (or complete) the lab; existing pieces are reused, so this is idempotent."""
    Path(spec.state_dir).mkdir(parents=True, exist_ok=True)
    os.chmod(spec.state_dir, 0o700)  # holds private keys
    state = load_state(spec.state_dir)
    _check_subnet_free(spec)
    state.bridge = spec.bridge
    save_state(spec.state_dir, state)
    _ensure_bridge(spec)
    _ensure_forward_guard(spec, state)
    for host in spec.hosts:
        _ensure_host(spec, state, host)
    if spec.ssh_hosts:
        _ensure_privsep_dir(state)
    save_state(spec.state_dir, state)
    return state


def _jumps_to(line: str, parent: str, chain: str) -> bool:
    tokens = line.split()
    return tokens[:2] == ["-A", parent] and "-j" in tokens and tokens[tokens.index("-j") + 1 :][:1] == [chain]


def _sshd_running() -> bool:
    """Any live sshd on the machine (ours are stopped by now; zombies awaiting reaping don't count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        comm, state = raw[raw.find("(") + 1 : raw.rfind(")")], raw[raw.rfind(")") + 2 :].split()[0]
        if comm == "sshd" and state not in ("Z", "X"):
            return True
    return False


def _remove_forward_guard(chain: str, bridge: str, removed: list[str]) -> None:
    listing = iptables("-S", "FORWARD", check=False).stdout.splitlines()
    for line in listing:
        if _jumps_to(line, "FORWARD", chain):
            iptables("-D", *line.split()[1:], check=False)
            removed.append(f"iptables {line}")
    if iptables("-S", chain, check=False).returncode == 0:
        iptables("-F", chain, check=False)
        iptables("-X", chain, check=False)
        removed.append(f"iptables chain {chain}")


def destroy(spec: LabSpec) -> list[str]:
    """Remove everything the lab made, from its state file *and* a sweep by name prefix.

    Works after a crash: unknown or already-missing pieces are skipped. Processes inside the
    lab's namespaces are ours by construction and are stopped before the namespace goes.
    Logs stay in the state dir for the post-mortem; keys and the state file are removed.
    """
    state = load_state(spec.state_dir)
    removed: list[str] = []

    for key, record in state.daemons.items():
        if kill_pid(record.pid, record.starttime):
            removed.append(f"daemon {key} pid {record.pid}")

    namespaces = set(state.netns) | {ns for ns in list_netns() if spec.owns_netns(ns)}
    for ns in sorted(namespaces):
        pids = sh(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            if kill_pid(int(pid), process_starttime(int(pid))):
                removed.append(f"process {pid} in {ns}")
        if ip("netns", "del", ns, check=False).returncode == 0:
            removed.append(f"netns {ns}")

    # Deleting a namespace deletes its veth end and thus the pair; sweep what is left.
    veths = set(state.veths) | {link for link in _links() if spec.owns_veth(link)}
    for veth in sorted(veths):
        if _link_exists(veth) and ip("link", "del", veth, check=False).returncode == 0:
            removed.append(f"veth {veth}")

    for bridge in {b for b in (state.bridge, spec.bridge) if b}:
        if _link_exists(bridge) and ip("link", "del", bridge, check=False).returncode == 0:
            removed.append(f"bridge {bridge}")
        for chain in {c for c in (state.forward_chain, f"CSLAB-{bridge}") if c}:
            _remove_forward_guard(chain, bridge, removed)

    if state.created_privsep_dir and not _sshd_running():
        try:
            Path("/run/sshd").rmdir()  # only if we made it, it is empty and no sshd may chroot there
        except OSError:
            pass
    shutil.rmtree(Path(spec.state_dir) / "ssh", ignore_errors=True)
    forget_state(spec.state_dir)
    return removed


def leftovers(spec: LabSpec) -> list[str]:
    """What of this lab still exists; empty after a clean destroy."""
    found = [f"netns {ns}" for ns in list_netns() if spec.owns_netns(ns)]
    found += [f"link {link}" for link in _links() if spec.owns_veth(link) or link == spec.bridge]
    if iptables("-S", spec.forward_chain, check=False).returncode == 0:
        found.append(f"iptables chain {spec.forward_chain}")
    found += [
        f"iptables {line}" for line in iptables("-S", "FORWARD", check=False).stdout.splitlines()
        if _jumps_to(line, "FORWARD", spec.forward_chain)
    ]
    return found
