"""Thin subprocess wrappers for the root-namespace commands the lab needs (ip, iptables)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

__all__ = ["LabError", "ip", "ip_json", "iptables", "netns_usable", "sh"]


class LabError(RuntimeError):
    """A lab setup step failed; the message carries the command and its stderr."""


def sh(
    argv: list[str], *, check: bool = True, input: str | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} -> rc={proc.returncode}: {proc.stderr.strip()}")
    return proc


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh(["ip", *args], check=check)


def ip_json(*args: str) -> list[dict[str, Any]]:
    proc = ip("-j", *args, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    return json.loads(proc.stdout)


def iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # -w: wait for the xtables lock instead of failing when another tool holds it.
    return sh(["iptables", "-w", "5", *args], check=check)


def netns_usable() -> str | None:
    """None when this process can build the lab, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, iptables)"
    for tool in ("ip", "iptables", "iptables-restore"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = "csprobe-usable"
    try:
        made = ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"ip netns add failed: {made.stderr.strip()}"
        run = sh(["ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up"], check=False)
        if run.returncode != 0:
            return f"ip netns exec failed: {run.stderr.strip()}"
    finally:
        ip("netns", "del", probe, check=False)
    return None
