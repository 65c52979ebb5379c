"""Which lab holds a prefix's namespaces: each daemon carries its lab's state dir, each lab the process that owns it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from lab.hosts.shell import sh
from lab.hosts.spec import LabSpec
from runtime.processes import pid_alive, process_starttime

__all__ = ["LAB_STATE_ENV", "OWNER_FILE", "Occupant", "daemon_env", "occupant", "record_owner"]

# Set in every daemon's environment (children inherit it): the namespaces of a prefix say which lab runs in them.
LAB_STATE_ENV = "COLDSTART_LAB_STATE"
# The process that brought the lab up and takes it down (a test session's worker, a drill, a bench). A lab
# from `coldstart lab up` has none: it stays until someone takes it down.
OWNER_FILE = "owner.json"


@dataclass(frozen=True)
class Occupant:
    """Another lab up in a prefix's namespaces: its state dir, its processes there, and its owner (pid, start)."""

    state_dir: Path
    pids: list[int]
    owner: tuple[int, float] | None

    @property
    def abandoned(self) -> bool:
        """Nobody will take it down: its owner ended without doing so (a killed test session), or its state dir,
        which `coldstart lab down` needs, is gone. Such a lab may be swept."""
        if self.owner is None:
            return not self.state_dir.is_dir()
        return not pid_alive(*self.owner)

    def describe(self) -> str:
        owner = ("no owner: left up on purpose" if self.owner is None
                 else f"owner pid {self.owner[0]} {'ended' if self.abandoned else 'running'}")
        return f"the lab in {self.state_dir} ({len(self.pids)} processes, {owner})"


def _state_dir(path: str | os.PathLike[str]) -> Path:
    return Path(path).resolve()


def daemon_env(spec: LabSpec) -> dict[str, str]:
    """The environment a lab daemon starts with: the caller's, marked with the lab's state dir."""
    return {**os.environ, LAB_STATE_ENV: str(_state_dir(spec.state_dir))}


def record_owner(state_dir: Path, pid: int | None) -> None:
    """Record `pid` as the lab's owner; None makes it ownerless (a lab left up on purpose)."""
    path = Path(state_dir) / OWNER_FILE
    if pid is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "starttime": process_starttime(pid)}))


def _owner(state_dir: Path) -> tuple[int, float] | None:
    try:
        record = json.loads((state_dir / OWNER_FILE).read_text())
        return int(record["pid"]), float(record["starttime"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _lab_of(pid: int) -> Path | None:
    try:
        marked = psutil.Process(pid).environ().get(LAB_STATE_ENV)
    except (psutil.Error, OSError):
        return None
    return _state_dir(marked) if marked else None


def occupant(spec: LabSpec) -> Occupant | None:
    """Another lab (another state dir) with processes in this spec's namespaces, or None.

    Processes with no mark (started by hand, or before daemons were marked) are nobody's here."""
    from lab.hosts.network import list_netns  # here, not at the top: network imports processes, which imports us

    mine = _state_dir(spec.state_dir)
    found: dict[Path, list[int]] = {}
    for ns in sorted(ns for ns in list_netns() if spec.owns_netns(ns)):
        for pid in map(int, sh(["ip", "netns", "pids", ns], check=False).stdout.split()):
            lab = _lab_of(pid)
            if lab is not None and lab != mine:
                found.setdefault(lab, []).append(pid)
    if not found:
        return None
    state_dir, pids = min(found.items(), key=lambda item: str(item[0]))
    return Occupant(state_dir=state_dir, pids=sorted(pids), owner=_owner(state_dir))
